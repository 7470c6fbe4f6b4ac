"""What the engine asks its drivers to do: every wait, every transport operation and
every store operation, as small typed values (checked by mypy where they are made and
where they are carried out; not frozen, which would cost each GET a microsecond, but
never changed once made). The steps themselves (``loop``, ``admission``) do no I/O:
they decide, and read only this process's memory.

The transport and the clock:

- :class:`Sleep`: wait ``seconds`` on the call's clock; answered True when the whole
  wait passed, False when the call's cancel ended it.
- :class:`Send`: send exactly one attempt with ``timeout``; answered with the
  transport's response, or its error thrown back into the steps.
- :class:`Keep`: read and keep a response's body (at most ``limit`` bytes, within
  ``seconds``); answered with the body (None when it cannot be had).
- :class:`Close`: close a response, dropping its connection.
- :class:`Follow`: follow a redirect response under ``retry`` (plain urllib3 only).

The store (each the plan's, through the failure layer; a driver may run them where a
blocking store cannot hold up others, as the async transports do on their threads):

- :class:`Admit`: take the next attempt's admission in one store operation
  (``Plan.admit_once``); answered None when admitted, else when to ask again;
  ``CooldownUnavailable`` thrown back when the store fails and the call fails closed.
- :class:`ReadCooldown`: the scope's stored cooldown (``Plan.read_cooldown``).
- :class:`GiveBack`: a reservation not used goes back (``Plan.give_back``).
- :class:`Settle`: the attempt is over (``response``; None when it failed or was not
  sent): its permit settled, its slot given back now or through ``on_done``.
- :class:`Judge`: what the answer teaches learned and shared, then the verdict
  (``verdict.judge``, then ``Plan.judged``); answered with the :class:`~.verdict.Verdict`.

A driver carries out every one of them: :func:`~.admission.drive` here and now, the
async httpx transports on an event loop (:func:`~.admission.carry_out_store` is the
store part both share).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from urllib3.util.retry import Retry

    from ..deferral import Deferral

__all__ = [
    "ADMIT",
    "GIVE_BACK",
    "READ_COOLDOWN",
    "Admit",
    "Close",
    "Follow",
    "GiveBack",
    "Judge",
    "Keep",
    "Op",
    "ReadCooldown",
    "Send",
    "Settle",
    "Sleep",
    "Steps",
    "StoreOp",
]


@dataclass(slots=True)
class Sleep:
    """Wait ``seconds`` (may be <= 0: no wait) on the call's clock."""

    seconds: float


@dataclass(slots=True)
class Send:
    """Send exactly one attempt (no retry, no redirect) with the transport's ``timeout``."""

    timeout: Any


@dataclass(slots=True)
class Keep:
    """Read and keep ``response``'s body: at most ``limit`` bytes (None: no bound), within
    ``seconds`` (None: no bound); past either the connection is dropped."""

    response: Any
    limit: int | None
    seconds: float | None


@dataclass(slots=True)
class Close:
    """Close ``response``, dropping its connection (the attempt ends here)."""

    response: Any


@dataclass(slots=True)
class Follow:
    """Follow the redirect ``response`` with the policy ``retry`` (counted already)."""

    response: Any
    retry: Retry


@dataclass(slots=True)
class Admit:
    """Take the next attempt's admission from the store (one operation)."""


@dataclass(slots=True)
class ReadCooldown:
    """Read the scope's cooldown from the store."""


@dataclass(slots=True)
class GiveBack:
    """Give the attempt's reservation back unused (``Plan.give_back``)."""


#: The store steps without arguments, made once.
ADMIT = Admit()
READ_COOLDOWN = ReadCooldown()
GIVE_BACK = GiveBack()


@dataclass(slots=True)
class Settle:
    """The attempt is over: ``response`` (None: it failed or was not sent) settles its
    permit; its slot goes back now, or through ``on_done(response, release)`` once its
    body is read or it is closed."""

    response: Any
    on_done: Callable[[Any, Callable[[], None]], None] | None


@dataclass(slots=True)
class Judge:
    """Learn from one attempt's answer and judge it: ``raw`` (the response as urllib3
    would have it, or None), ``cause`` (the urllib3 error behind a transport failure),
    ``body`` (read when a dialect needs it)."""

    method: str | None
    url: str | None
    raw: Any
    cause: Exception | None
    body: bytes | None


#: A store operation the engine asks of its driver.
StoreOp = Admit | ReadCooldown | Settle | Judge | GiveBack
#: One thing the engine asks of its driver.
Op = Sleep | Send | Keep | Close | Follow | StoreOp
#: A piece of the engine written once for every driver: a generator of :data:`Op`.
Steps = Generator[Op, Any, "Deferral | None"]
