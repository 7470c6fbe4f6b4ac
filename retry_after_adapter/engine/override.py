"""``budget()``: the limits a caller sets for the calls made inside a ``with`` block.

The only context variable of the engine: each call reads it once, when it starts.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final

from ..clock import Event
from ..cost import BUDGET, check_cost
from ..deferral import Deferral
from ..errors import ConfigurationError
from ..policy import check_limit

__all__ = ["UNSET", "Override", "budget", "current_override"]


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Final = _Unset()


@dataclass(frozen=True)
class Override:
    """Limits set by :func:`budget` for the calls made inside it (seconds)."""

    deadline: float | _Unset | None = UNSET
    max_wait: float | _Unset | None = UNSET
    cancel: Event | None = None
    resume: Deferral | None = None
    #: The calls' cost in tokens (None: the front end's ``cost=`` decides).
    cost: int | None = None
    #: The calls' place among waiters of their scope (None: 0, ordinary).
    priority: int | None = None


_OVERRIDE: contextvars.ContextVar[Override | None] = contextvars.ContextVar(
    "retry_after_adapter_budget", default=None
)


@contextmanager
def budget(
    *,
    deadline: float | _Unset | None = UNSET,
    max_wait: float | _Unset | None = UNSET,
    cancel: Event | None = None,
    resume: Deferral | None = None,
    cost: int | None = None,
    priority: int | None = None,
) -> Iterator[None]:
    """Override the retry budget of every call made inside the ``with`` block.

    - ``deadline``: seconds each call may take from its start, waits and redirects
      included (``None`` removes the policy's deadline).
    - ``max_wait``: the longest single wait in seconds (``None``: no limit).
    - ``cancel``: a ``threading.Event`` (or, in async code, an ``asyncio.Event``);
      setting it ends a running wait at once and the call returns a deferral with
      reason ``"cancelled"``.
    - ``resume``: a :class:`Deferral` this call continues: its attempt and deferral
      counts and history carry over, and nothing is sent before its ``eligible_at``.
    - ``cost``: what each call costs in tokens (an int >= 0), weighed against a token
      quota (``Quota(..., unit="tokens")``) and the server's announced token
      allowance; it takes the place of the front end's ``cost=``.
    - ``priority``: the calls' place among the calls waiting on a shared quota of
      their scope (an int from -2**31 to 2**31 - 1; higher first; 0 by default, a
      negative one after the ordinary calls): a call that waits for a permit is
      placed ahead of every waiting call of a lower priority, across processes
      sharing the store (a store with reservations: memory, SQLite, Redis). It still
      waits for the next permit to free.

    Like every ``budget`` limit it applies to the calls of the current thread or
    task: a thread started inside the block does not inherit it (a context variable).

    Unset arguments keep the value of an enclosing ``budget`` or of the policy.
    """
    if not isinstance(deadline, _Unset):
        check_limit("deadline", deadline)
    if not isinstance(max_wait, _Unset):
        check_limit("max_wait", max_wait)
    if cancel is not None and not callable(getattr(cancel, "is_set", None)):
        raise ConfigurationError("cancel must be a threading.Event or an asyncio.Event")
    if resume is not None and not isinstance(resume, Deferral):
        raise ConfigurationError("resume must be a Deferral (use Deferral.from_dict on stored JSON)")
    if cost is not None:
        cost = check_cost(cost, BUDGET)
    if priority is not None and (type(priority) is not int or not -(2**31) <= priority < 2**31):
        raise ConfigurationError(f"priority must be an int from -2**31 to 2**31 - 1, not {priority!r}")
    outer = _OVERRIDE.get() or Override()
    merged = Override(
        deadline=deadline if not isinstance(deadline, _Unset) else outer.deadline,
        max_wait=max_wait if not isinstance(max_wait, _Unset) else outer.max_wait,
        cancel=cancel if cancel is not None else outer.cancel,
        resume=resume if resume is not None else outer.resume,
        cost=cost if cost is not None else outer.cost,
        priority=priority if priority is not None else outer.priority,
    )
    token = _OVERRIDE.set(merged)
    try:
        yield
    finally:
        _OVERRIDE.reset(token)


#: ``current_override()``: the overrides of the innermost enclosing :func:`budget`, or
#: None (the context variable's own ``get``: no Python frame on the hot path).
current_override = _OVERRIDE.get
