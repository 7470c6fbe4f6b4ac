"""The records a call is made of, and what the engine reads of its policy and its call.

The bottom of the engine (it imports nothing of it): :class:`Heard` (what the server
said last), :class:`Ticket` (one attempt's admission, from grant to answer),
:class:`Terms` (what a call may spend), :class:`Progress` (what the job has spent) and
:class:`Slot` (a concurrency slot to give back); :class:`Policy`, the settings the
engine reads of a ``RetryAfterRetry`` (declared here, so that the engine does not import
the policy that drives it); :class:`CallState`, what the plan reads and writes of a
call. Durations are seconds (float); times stored or put in a deferral are aware UTC
datetimes; ``Progress.start`` and ``Ticket``'s marks are monotonic seconds.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, NamedTuple, Protocol

from urllib3.util.retry import Retry

from ..clock import Clock, Event
from ..deferral import Deferral
from ..observe import DecisionHook

if TYPE_CHECKING:
    from ..cooldown.base import PartwiseStore

__all__ = ["NOTHING_HEARD", "CallState", "Heard", "Policy", "Progress", "Slot", "Terms", "Ticket"]


class Policy(Retry):
    """What the engine reads of a call's policy beyond urllib3's ``Retry``: the
    settings of a :class:`~retry_after_adapter.RetryAfterRetry` (which sets each one in
    its ``__init__``; see it for their meaning). Seconds for durations, bytes for
    ``max_retry_body``; None: no limit."""

    deadline: float | None
    max_wait: float | None
    jitter: float
    attempt_reserve: float
    max_lifetime: float | None
    on_invalid: str
    max_retry_after: float | None
    cooldown_statuses: frozenset[int]
    quota_headers: bool
    max_deferrals: int | None
    max_retry_body: int | None
    clock: Clock
    #: The clock reads the real present (a store may read it itself as it grants).
    real_clock: bool
    on_decision: tuple[DecisionHook, ...]
    #: The terms its calls share, with the hooks they were made for (``terms_of``).
    _terms: tuple[tuple[DecisionHook, ...], Terms] | None


class Slot:
    """Gives one concurrency slot back, once, when called (the attempt it covered has
    ended); a second call does nothing."""

    __slots__ = ("free", "scope", "token")

    def __init__(self, free: Callable[[str, str], None], scope: str, token: str) -> None:
        self.free = free
        self.scope = scope
        self.token: str | None = token

    def __call__(self) -> None:
        token = self.token
        if token is not None:
            self.token = None
            self.free(self.scope, token)


class Heard(NamedTuple):
    """What the server said last: the answer's status, its raw Retry-After (trimmed)
    and the clock skew its Date showed (seconds); None: not said, or no answer yet."""

    status: int | None = None
    retry_after: str | None = None
    skew: float | None = None


NOTHING_HEARD = Heard()


class Ticket:
    """One attempt's admission, from its grant to its answer: what the store gave it
    and what its answer must settle (written by the plan, ``engine.plan``), how long it
    waited for a slot and whether it queued (``engine.admission``), and when it was
    sent (``engine.loop``).

    Every field starts at its class default (made per call with no ``__init__``: the
    defaults are immutable, and an attempt writes what it takes)."""

    #: The slot the call holds while an attempt is on the wire.
    lease_token: str | None = None
    #: When the quota permit of the attempt on the wire stops counting, as stored, and
    #: when (monotonic seconds) its admission started.
    permit: datetime | None = None
    admitted_at = 0.0
    #: That permit is an open one: it counts until its answer settles it (see
    #: ``Plan.answered``).
    permit_open = False
    #: The permit is a reservation: the attempt goes at this time (wall clock), not
    #: before, without asking again (None: it goes now; see ``Plan.give_back``).
    reserved: datetime | None = None
    #: The stored end of the reservation held while asking again at its time
    #: (``Ask.held``; None: none).
    held: datetime | None = None
    #: The admission number of the attempt on the wire, for quota headers.
    admission: int | None = None
    #: The learned rate's epoch the attempt on the wire was admitted in (None: no
    #: learned rate governed it), and whether its good answer is to be told.
    rate_epoch: int | None = None
    rate_report = False
    #: The last admission was refused by the scope's learned rate (reason ``rate``).
    rate_held = False
    #: A learned rate's probe slot, given back once the attempt's answer is judged.
    probe: Slot | None = None
    #: The last admission was refused only for want of a concurrency slot.
    slot_busy = False
    #: How long (seconds) this attempt has waited for a concurrency slot so far.
    slot_waited = 0.0
    #: Counted among the calls waiting on its scope in this process (max_waiting).
    queued = False
    #: When (monotonic seconds) the last attempt was sent; None: none yet.
    sent_at: float | None = None
    #: When the token permit of the attempt on the wire stops counting, as stored
    #: (None: it took none; see ``Plan._weigh``), and its number among the announced
    #: token allowance's tokens (``Admission.token_seq``; None: not counted).
    weighed: datetime | None = None
    token_seq: int | None = None

    def uncounted(self) -> None:
        """The attempt moved to a scope whose store record did not count it (a refined
        bucket): it has no admission number there."""
        self.admission = None


class Terms:
    """What a call may spend: its deadline and maximum wait (seconds; None: none), its
    cancel event and its decision hooks. Never changed once made: a policy's calls
    share one (:func:`terms_of`), and an enclosing ``budget()`` makes its own."""

    __slots__ = ("cancel", "deadline", "hooks", "max_wait")

    def __init__(
        self, deadline: float | None, max_wait: float | None, cancel: Event | None,
        hooks: tuple[DecisionHook, ...],
    ) -> None:
        self.deadline = deadline
        self.max_wait = max_wait
        self.cancel = cancel
        self.hooks = hooks


class Progress:
    """What the job has spent so far: when this call started (the clock's monotonic
    seconds; set per call), and, carried across its deferrals, the attempts sent, the
    deferrals before this call, the chain of those deferrals, when its first attempt
    was sent (UTC) and the eligible time it resumes at (no attempt before it; UTC).
    Fields start at their class defaults (immutable), as :class:`Ticket`'s."""

    start = 0.0
    attempts = 0
    deferrals_before = 0
    history: tuple[Deferral, ...] = ()
    started_at: datetime | None = None
    #: No attempt before this: the eligible time of the deferral this call resumes.
    not_before: datetime | None = None
    #: What each attempt of the call costs in tokens (0: none declared; see ``cost``),
    #: and where it came from (the ``cost=`` option or ``cost.BUDGET``), for an error.
    cost = 0
    cost_from: object = None
    #: The call's place among waiters of its scope (``budget(priority=...)``; 0:
    #: ordinary): sent with each reservation (``Ask.priority``).
    priority = 0
    #: Whether the request can be sent again as it is: False for a body read once as it
    #: is sent (a generator, a file), which nothing makes a replay of (set by the front
    #: end; read only when a provider's answer would let a POST be replayed).
    resendable = True


class CallState(Protocol):
    """What the plan (``engine.plan``) reads and writes of a call (an
    ``engine.call.Call``): its scope, its cooldown as last read, its attempt's ticket,
    what it has spent and may spend, its clock, its policy and the store as it talks to it."""

    scope: str | None
    cooldown: datetime | None
    ticket: Ticket
    progress: Progress
    terms: Terms
    clock: Clock
    policy: Policy
    store: PartwiseStore | None
