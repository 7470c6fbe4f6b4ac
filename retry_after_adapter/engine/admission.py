"""Admission before every attempt (the first and each retry): one store operation when
nothing holds the attempt back; else wait out what does (a cooldown, a resumed
deferral, a quota permit, a concurrency slot) while that fits the budget, or defer
without sending (``cooldown``, ``quota``, ``concurrency``, ``deadline``...).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from .. import _forksafe
from ..deferral import Deferral
from ..errors import CooldownUnavailable
from ..policy import DEFER, EPSILON, RETRY, Decision, Reason
from ..policy import admit as admit_decision
from .call import MIN_ATTEMPT_TIMEOUT
from .ops import (
    ADMIT,
    GIVE_BACK,
    READ_COOLDOWN,
    Admit,
    Close,
    Follow,
    GiveBack,
    Judge,
    Keep,
    Op,
    ReadCooldown,
    Send,
    Settle,
    Sleep,
    Steps,
    StoreOp,
)
from .verdict import jitter, judge

if TYPE_CHECKING:
    from .call import Call

R = TypeVar("R")

__all__ = [
    "SLOT_POLL",
    "STORE_STEPS",
    "UNKNOWN_COOLDOWN_RETRY",
    "admit_slowly",
    "admitted",
    "carry_out",
    "carry_out_store",
    "drive",
    "wait_steps",
    "wait_until",
]

#: Seconds after which a call deferred with ``cooldown-unknown`` may try again.
UNKNOWN_COOLDOWN_RETRY = 1.0
#: How often admission looks again at what others keep taking (slot polls not counted),
#: once its waits add up to more than ``max_wait``: while they fit, the call waits its
#: turn (a provider's bucket gives one request a step, and every waiter wakes for it).
MAX_ROUNDS = 16
#: Seconds after which a priority call (``budget(priority=N)``, N > 0) held back at its
#: reservation's time asks again at the latest the first time (twice as long each time
#: after): the few calls that may jump the queue do not sleep a window on an answer
#: that comes a few milliseconds later.
PRIORITY_RECHECK = 0.05
#: The most looks in any case (waits of next to nothing must end too).
MOST_ROUNDS = 8 * MAX_ROUNDS
#: Seconds between looks for a free concurrency slot while waiting for one.
SLOT_POLL = 0.05


def admitted(call: Call) -> Generator[Op, Any, bool]:
    """The common case, without waiting: True when the next attempt may go now
    (nothing pending, nothing held, what it needs taken: one store operation); False
    when :func:`admit_slowly` must look, wait or defer (the steps of an admission that
    is not the common case)."""
    terms = call.terms
    if terms.cancel is not None or call.progress.not_before is not None:
        return False
    if terms.deadline is not None and call.clock.monotonic() - call.progress.start > terms.deadline:
        return False  # out of time (``Call.out_of_time``, read here: every GET passes)
    if call.plan.store is None:
        return True  # nothing shared, nothing resumed, time left: nothing to wait for
    try:  # _take, written out: every GET passes here
        not_before = yield ADMIT
    except CooldownUnavailable:
        return False  # the rounds of admit_slowly apply the failure policy
    except GeneratorExit:
        raise
    except BaseException:
        yield Settle(None, None)  # nothing is sent: its slot back, its permit settled
        raise
    if not_before is None and call.ticket.reserved is not None:
        try:
            return (yield from _hold_reservation(call)) is None
        except CooldownUnavailable:
            return False  # (its reservation counts until its stored end)
    return not_before is None


def _hold_reservation(call: Call) -> Generator[Op, Any, datetime | None]:
    """The store reserved the attempt's permit for a later time (``ticket.reserved``):
    sleep until then (cancellable), then ask once more holding it (``Ask.held``: given
    back and decided again in the same operation, so that a permit it counted on that
    was answered late holds it back): None when the attempt may go now, else when to
    look again (nothing held). A cancel gives the reservation back, unused (one store
    operation)."""
    ticket = call.ticket
    for rounds in range(MAX_ROUNDS):
        reserved = ticket.reserved
        if reserved is None:
            return None
        left = call.seconds_until(reserved)
        if rounds and call.progress.priority > 0:
            # Held back at its place, most often by a permit whose answer is on its way:
            # a priority call looks again soon rather than when that permit could end,
            # sooner first (50 ms, then twice as long each time: its rounds are counted).
            left = min(left, PRIORITY_RECHECK * 2 ** (rounds - 1))
        call.emit(Decision(RETRY, left, Reason.QUOTA))
        try:
            slept = yield Sleep(left)
        except BaseException:
            yield GIVE_BACK
            raise
        if not slept:
            yield GIVE_BACK
            return reserved
        ticket.held, ticket.permit, ticket.reserved = ticket.permit, None, None
        not_before = yield from _take(call, False)
        if not_before is not None:
            return not_before
    yield GIVE_BACK
    return call.clock.now()


def _take(call: Call, hold: bool = True) -> Generator[Op, Any, datetime | None]:
    """One admission from the store (:class:`~.ops.Admit`): None when admitted (a
    reservation slept on first, when ``hold``), else when to ask again. Anything else
    thrown in while it ran (a cancel) gives back what it took first."""
    try:
        not_before: datetime | None = yield ADMIT
    except (CooldownUnavailable, GeneratorExit):
        raise
    except BaseException:
        yield Settle(None, None)  # nothing is sent: its slot back, its permit settled
        raise
    if hold and not_before is None and call.ticket.reserved is not None:
        return (yield from _hold_reservation(call))  # (a cancel defers at the next look)
    return not_before


def admit_slowly(call: Call) -> Steps:
    """Look, wait while it fits, look again: at most :data:`MAX_ROUNDS` waits (a slot's
    short polls not counted), more while they add up to no more than ``max_wait`` (at
    most :data:`MOST_ROUNDS`), each followed by a look; then defer for what held the
    last look back, at the time that look was told."""
    try:
        return (yield from _admit_rounds(call))
    finally:
        _retire(call)


def _admit_rounds(call: Call) -> Steps:
    """The rounds of :func:`admit_slowly` (see it)."""
    rounds = 0
    waited = 0.0
    while True:
        if call.cancelled():
            return call.defer(Decision(DEFER, 0.0, Reason.CANCELLED), until=call.pending())
        try:
            until, why = yield from _look(call)
        except CooldownUnavailable:
            return call.defer(Decision(DEFER, UNKNOWN_COOLDOWN_RETRY, Reason.COOLDOWN_UNKNOWN))
        if until is None:
            _slot_waited(call)
            return None
        if why is Reason.CONCURRENCY or (why is Reason.RATE and call.ticket.slot_busy):
            # Only a slot is missing (the cap's, or a probe's): look again shortly (not a round).
            deferral = yield from _wait_for_slot(call, until, why)
            if deferral is not None:
                return deferral
            continue
        spent = rounds >= MOST_ROUNDS or (rounds >= MAX_ROUNDS and not _waits_fit(call, waited))
        if spent and why is not Reason.DEADLINE:
            return _defer_after_rounds(call, until, why)
        rounds += 1
        left = call.seconds_until(until)
        _enlist(call, left)
        deferral = yield from _wait(call, until, left, why)
        if deferral is not None:
            return deferral
        waited += max(0.0, left)
        yield from _let_elders_look(call)


def _waits_fit(call: Call, waited: float) -> bool:
    """Whether ``waited`` seconds of admission waits still fit the call's ``max_wait``
    (none set: the rounds alone bound them)."""
    most = call.terms.max_wait
    return most is not None and waited <= most


def _look(call: Call) -> Generator[Op, Any, tuple[datetime | None, Reason]]:
    """One look: ``(None, ...)`` when admitted (what the call needs is taken), else
    when to look again and why. Nothing is taken while a resumed deferral's time is
    ahead, nor once the call is out of time (then ``(now, DEADLINE)`` when nothing else
    holds it back)."""
    now = call.clock.now()
    not_before = call.progress.not_before
    ahead = not_before if not_before is not None and not_before > now else None
    late = call.out_of_time()
    if ahead is not None or late:
        stored = yield READ_COOLDOWN
        return _held(now, ahead, stored, late)
    if call.plan.store is None:
        return None, Reason.COOLDOWN
    not_before = yield from _take(call)
    if not_before is None:
        return None, Reason.COOLDOWN
    return not_before, _why(call, not_before)


def _held(
    now: datetime, ahead: datetime | None, stored: datetime | None, late: bool
) -> tuple[datetime | None, Reason]:
    """A resumed deferral's time is ahead, or the call is out of time (the scope's
    ``stored`` cooldown read): nothing is taken; when to look again (the later of those
    times), or ``(now, DEADLINE)`` out of time with nothing else to wait for."""
    until = max((t for t in (ahead, stored) if t is not None and t > now), default=None)
    if until is not None:
        return until, Reason.COOLDOWN
    return (now, Reason.DEADLINE) if late else (None, Reason.COOLDOWN)


def _why(call: Call, not_before: datetime) -> Reason:
    """What held back an admission the store refused until ``not_before``."""
    if call.ticket.rate_held:
        return Reason.RATE  # its limit, its probes' slots, or a backoff
    if call.ticket.slot_busy:
        return Reason.CONCURRENCY
    if call.cooldown is not None and not_before == call.cooldown:
        return Reason.COOLDOWN
    return Reason.QUOTA


def _wait(call: Call, until: datetime, left: float, why: Reason) -> Steps:
    """Wait ``left`` seconds (plus jitter) for ``until`` if that fits the budget and
    the scope's waiting queue; else the deferral (reason ``why``, or the limit's)."""
    if why is Reason.DEADLINE:
        return call.defer(Decision(DEFER, 0.0, Reason.DEADLINE))
    # Workers held back by one cooldown would all wake at its end: spread them.
    left += jitter(call)
    decision = admit_decision(
        cooldown_left=left,
        elapsed=call.elapsed(),
        deadline=call.terms.deadline,
        max_wait=call.terms.max_wait,
        attempt_reserve=call.policy.attempt_reserve,
    )
    if decision.action == DEFER:
        if decision.reason == Reason.COOLDOWN:
            decision = Decision(DEFER, decision.wait, _unfit(call, left, why))
        return call.defer(decision, until=until)
    if not _queue(call):  # max_waiting calls already wait on this scope here
        return call.defer(Decision(DEFER, left, why), until=until)
    try:
        call.emit(Decision(RETRY, left, why))
        slept = yield Sleep(left)
    finally:
        _unqueue(call)
    if not slept:
        return call.defer(Decision(DEFER, 0.0, Reason.CANCELLED), until=until)
    return None


def _unfit(call: Call, left: float, why: Reason) -> Reason:
    """Why a wait of ``left`` seconds for what ``why`` names does not fit: ``deadline``
    when it would fit ``max_wait`` but end past the deadline (the deadline forced the
    deferral, as the reasons table says); else ``why`` itself (the cooldown, quota,
    rate or slot is longer than the caller waits)."""
    most = call.terms.max_wait
    if call.terms.deadline is not None and (most is None or left <= most + EPSILON):
        return Reason.DEADLINE
    return why


def _defer_after_rounds(call: Call, until: datetime, why: Reason) -> Deferral:
    """Still not admitted after every round (others keep taking what frees up): defer
    for what held the last look back (``why``), eligible when that look was told
    (``until``: the store's earliest time, a permit that frees as the call gives up
    included), no sooner than :data:`~.call.MIN_ATTEMPT_TIMEOUT` from now. (0.14 deferred
    for the length of the last wait again, from its end, without looking: a call whose
    sixteenth wait ran to a window's start was told to come back a window later.)"""
    soonest = call.clock.now() + timedelta(seconds=MIN_ATTEMPT_TIMEOUT)
    until = max(until, soonest)
    return call.defer(Decision(DEFER, call.seconds_until(until), why), until=until)


def _slot_waited(call: Call) -> None:
    """Admitted after looking for a slot (:func:`_wait_for_slot`): one decision says how
    long it waited (seconds, the looks' sleeps added up), as a wait for a cooldown or a
    permit is said before it is slept; the looks themselves are not decisions."""
    waited = call.ticket.slot_waited
    if waited > 0.0:
        call.ticket.slot_waited = 0.0  # said once
        call.emit(Decision(RETRY, waited, Reason.CONCURRENCY))


def _wait_for_slot(call: Call, busy_until: datetime, why: Reason) -> Steps:
    """Every slot is held until ``busy_until`` at the latest: wait ``SLOT_POLL`` seconds
    (or less) before looking again, while the whole wait for a slot fits the budget
    (``call.ticket.slot_waited`` adds up); else the deferral with reason ``why``
    (``concurrency``, or ``rate`` for the learned rate's probes), eligible when the
    earliest lease expires (by when a slot is free at the latest)."""
    step = min(SLOT_POLL, max(call.seconds_until(busy_until), 0.001))
    waited = call.ticket.slot_waited
    decision = admit_decision(
        cooldown_left=waited + step,
        elapsed=call.elapsed(),
        deadline=call.terms.deadline,
        max_wait=call.terms.max_wait,
        attempt_reserve=call.policy.attempt_reserve,
    )
    over = call.terms.max_wait is not None and waited + step > call.terms.max_wait
    # Out of budget, or max_waiting calls already wait on this scope here.
    if decision.action == DEFER or over or not _queue(call):
        left = call.seconds_until(busy_until)
        if decision.action == DEFER and not over:
            why = _unfit(call, waited + step, why)  # the deadline, not the slot's wait
        return call.defer(Decision(DEFER, left, why), until=busy_until)
    try:
        slept = yield Sleep(step)
    finally:
        _unqueue(call)
    if not slept:
        return call.defer(Decision(DEFER, 0.0, Reason.CANCELLED), until=busy_until)
    call.ticket.slot_waited = waited + step
    return None


def wait_steps(call: Call, target: float) -> Steps:
    """Wait until monotonic time ``target``; a cancel ends it with a deferral."""
    if (yield Sleep(target - call.clock.monotonic())):
        return None
    return call.defer(Decision(DEFER, max(0.0, target - call.clock.monotonic()), Reason.CANCELLED))


def wait_until(call: Call, target: float) -> Deferral | None:
    """:func:`wait_steps` on the call's clock, here and now (a stock urllib3 loop's wait)."""
    return drive(call, None, wait_steps(call, target))


def drive(call: Call, transport: Any, steps: Generator[Op, Any, R]) -> R:
    """The synchronous driver: carry out each :data:`~.ops.Op` of ``steps`` here (a
    sleep on the call's clock, a transport operation, a store operation), hand back its
    result or throw its exception into the steps, and return what they return."""
    value: Any = None
    error: BaseException | None = None
    store_steps = STORE_STEPS
    while True:
        try:
            op = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        error = None
        try:
            store_step = store_steps.get(type(op))
            value = carry_out(call, transport, op) if store_step is None else store_step(call, op)
        except BaseException as exc:  # thrown back in: the steps clean up, or handle it
            value, error = None, exc


def carry_out(call: Call, transport: Any, op: Op) -> Any:
    """One :data:`~.ops.Op` that is not a store step (those are :data:`STORE_STEPS`'),
    here and now."""
    if isinstance(op, Send):
        return transport.send(op.timeout)
    if isinstance(op, Sleep):
        return call.sleep(op.seconds)
    if isinstance(op, Keep):
        return transport.keep(op.response, op.limit, op.seconds)
    if isinstance(op, Close):
        return transport.close(op.response)
    if isinstance(op, Follow):
        return transport.follow(op.response, op.retry)
    raise TypeError(f"not an operation of the engine: {type(op).__name__}")


def carry_out_store(call: Call, op: StoreOp) -> Any:
    """One store step of the call's plan, here and now (on whichever thread the driver
    chose)."""
    return STORE_STEPS[type(op)](call, op)


def _admit(call: Call, op: Admit) -> datetime | None:
    return call.plan.admit_once(call)


def _settle(call: Call, op: Settle) -> None:
    plan = call.plan
    plan.answered(call, op.response, op.on_done)
    if op.response is None:
        plan.judged(call)  # nothing to judge: a probe's slot goes back too


def _judge(call: Call, op: Judge) -> Any:
    try:
        return judge(call, op.method, op.url, op.raw, op.cause, body=op.body)
    finally:
        if call.ticket.probe is not None:
            call.plan.judged(call)  # a probe's slot, once what the answer taught is learned


def _read_cooldown(call: Call, op: ReadCooldown) -> datetime | None:
    return call.plan.read_cooldown(call)


def _give_back(call: Call, op: GiveBack) -> None:
    call.plan.give_back(call)


#: Each store step's work, by its type (one dictionary look-up a step, no chain of
#: type tests): what :func:`drive` and the async driver carry out on a store's behalf.
STORE_STEPS: dict[type[Any], Callable[[Call, Any], Any]] = {
    Admit: _admit,
    Settle: _settle,
    Judge: _judge,
    ReadCooldown: _read_cooldown,
    GiveBack: _give_back,
}


# ---------------------------------------------------------------- the waiting queue
#: Calls waiting before an attempt, per (store object, scope), in this process.
_WAITING: dict[tuple[int, str], int] = {}
_WAITING_LOCK = threading.Lock()


#: Calls of this process waiting for their scope's next permit, cooldown end or rate
#: step, per (store object, scope): ``id(call)`` -> (monotonic second it began waiting,
#: monotonic second its present wait ends). See :func:`_let_elders_look`.
_ELDERS: dict[tuple[int, str], dict[int, tuple[float, float]]] = {}
#: Seconds a call that woke lets an elder of its scope look first (one that began
#: waiting before it and whose wait has ended too), at most :data:`ELDER_YIELDS` times.
ELDER_YIELD = 0.002
ELDER_YIELDS = 3


def _new_lock() -> None:
    """In a forked child: a parent thread may have held the lock, and the calls the
    parent's threads had waiting are not this process's."""
    global _WAITING_LOCK
    _WAITING_LOCK = threading.Lock()
    _WAITING.clear()
    _ELDERS.clear()


def _enlist(call: Call, left: float) -> None:
    """The call waits ``left`` seconds for its scope (its first wait starts its age)."""
    if call.scope is None:
        return
    now = call.clock.monotonic()
    key = (id(call.plan.store), call.scope)
    with _WAITING_LOCK:
        waiting = _ELDERS.setdefault(key, {})
        since = waiting.get(id(call), (now, now))[0]
        waiting[id(call)] = (since, now + max(0.0, left))


def _retire(call: Call) -> None:
    """The call waits no more (admitted, deferred, or gone)."""
    if call.scope is None:
        return
    key = (id(call.plan.store), call.scope)
    with _WAITING_LOCK:
        waiting = _ELDERS.get(key)
        if waiting is not None and waiting.pop(id(call), None) is not None and not waiting:
            del _ELDERS[key]


def _let_elders_look(call: Call) -> Generator[Op, Any, None]:
    """Waiters of one scope in one process woken by the same permit would race for it,
    the winner by chance: one could lose every race until its ``max_wait`` was spent
    (a bucket gives one request a step, and every waiter wakes for it). So a call that
    woke lets an elder (waiting longer, its wait over too, not yet looked) look first,
    :data:`ELDER_YIELD` seconds at a time: the scope's waiters here are served in the
    order they began waiting. A lone waiter pays nothing."""
    if call.scope is None:
        return
    key = (id(call.plan.store), call.scope)
    for _ in range(ELDER_YIELDS):
        now = call.clock.monotonic()
        with _WAITING_LOCK:
            waiting = _ELDERS.get(key, {})
            mine = waiting.get(id(call))
            elder = mine is not None and any(
                since < mine[0] and due <= now for other, (since, due) in waiting.items() if other != id(call)
            )
        if not elder:
            return
        yield Sleep(ELDER_YIELD)


_forksafe.at_fork(_new_lock)


def _queue(call: Call) -> bool:
    """Count the call as waiting on its scope; False (not counted) when ``max_waiting``
    calls already wait there: it defers at once instead of tying up a worker."""
    bound = call.plan.max_waiting
    if bound is None or call.scope is None:
        return True
    key = (id(call.plan.store), call.scope)
    with _WAITING_LOCK:
        waiting = _WAITING.get(key, 0)
        if waiting >= bound:
            return False
        _WAITING[key] = waiting + 1
    call.ticket.queued = True
    return True


def _unqueue(call: Call) -> None:
    if not call.ticket.queued or call.scope is None:
        return
    call.ticket.queued = False
    key = (id(call.plan.store), call.scope)
    with _WAITING_LOCK:
        waiting = _WAITING.get(key, 0) - 1
        if waiting > 0:
            _WAITING[key] = waiting
        else:
            _WAITING.pop(key, None)
