"""What the engine asks its drivers to do: the only waiting and transport I/O it does
not do itself, as small typed values (checked by mypy where they are made and where
they are carried out; not frozen, which would cost each GET a microsecond, but
never changed once made).

- :class:`Sleep`: wait ``seconds`` on the call's clock; answered True when the whole
  wait passed, False when the call's cancel ended it.
- :class:`Send`: send exactly one attempt with ``timeout``; answered with the
  transport's response, or its error thrown back into the steps.
- :class:`Keep`: read and keep a response's body (at most ``limit`` bytes, within
  ``seconds``); answered with the body (None when it cannot be had).
- :class:`Close`: close a response, dropping its connection.
- :class:`Follow`: follow a redirect response under ``retry`` (plain urllib3 only).

A driver carries out every one of them: :func:`~.admission.drive` here and now, the
async httpx transport on an event loop.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from urllib3.util.retry import Retry

    from ..deferral import Deferral

__all__ = ["Close", "Follow", "Keep", "Op", "Send", "Sleep", "Steps"]


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


#: One thing the engine asks of its driver.
Op = Sleep | Send | Keep | Close | Follow
#: A piece of the engine written once for every driver: a generator of :data:`Op`.
Steps = Generator[Op, Any, "Deferral | None"]
