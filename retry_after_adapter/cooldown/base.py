"""The cooldown store protocol: one shared "next eligible time" per scope.

A store maps a scope (a short string such as ``"https://api.example.com:443"``) to an
aware UTC ``datetime`` before which no worker of that scope may send. Times are
wall-clock UTC so that processes and machines agree; the only write is an atomic
*later-wins* extend, so a shorter cooldown never replaces a longer one.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import NamedTuple, Protocol, runtime_checkable

from ..errors import ConfigurationError


@runtime_checkable
class CooldownStore(Protocol):
    """Where workers share cooldowns. Implementations must be thread-safe.

    Errors while talking to a backend are raised as ``CooldownStoreError``; the adapter
    turns them into its failure policy (fail open with a local copy, or fail closed).
    """

    def get(self, scope: str) -> datetime | None:
        """The stored eligible time (aware UTC) for ``scope``, or None if there is none.

        A time in the past may be returned; callers compare it with their clock.
        """
        ...

    def extend(self, scope: str, until: datetime) -> datetime:
        """Atomically set ``scope``'s eligible time to the later of the stored one and
        ``until`` (aware), and return the effective (later) time in UTC."""
        ...


class _Fields(NamedTuple):
    cooldown: datetime | None
    not_before: datetime | None
    seq: int | None = None
    slot_busy: bool = False


class Admission(_Fields):
    """What a store's ``admit`` answers for one attempt.

    ``cooldown``: the scope's stored cooldown (may be past). ``not_before``: None when
    the attempt may go (what was asked for is taken: a quota permit, one of the
    announced allowance, a concurrency slot), else when to ask again (nothing taken).
    ``seq``: the attempt's admission number once the scope's quota headers are counted,
    else None. ``slot_busy``: refused only because every concurrency slot is held
    (``not_before`` is then when the earliest lease expires).

    ``permit`` (not one of the tuple's four fields, so an Admission still unpacks and
    compares as before): when the quota permit taken stops counting (its grant + per +
    margin) as stored, on a :class:`Granted`; None otherwise."""

    __slots__ = ()

    #: See above: set on a :class:`Granted`.
    permit: datetime | None = None


class Granted(Admission):
    """An admission that took a quota permit; ``permit`` says when it stops counting
    (a store's ``settle`` moves that later when the attempt's answer came late)."""

    @classmethod
    def of(cls, permit: datetime, cooldown: datetime | None, seq: int | None = None) -> Granted:
        granted = cls(cooldown, None, seq, False)
        granted.permit = permit
        return granted


class Hold(NamedTuple):
    """One thing a store holds a scope back with, and when it ends (aware UTC).

    ``kind``: ``"cooldown"`` (a Retry-After or an exhausted announcement), ``"allowance"``
    (the server's announced quota used up until its reset), ``"quota"`` (a configured
    ``Quota``'s permits all taken: ``number`` of them, its limit), or ``"leases"``
    (``number`` concurrency slots held, the last until ``until``)."""

    kind: str
    until: datetime
    number: int = 0


def check_scope(scope: object) -> str:
    """Validate a scope key: a non-empty str of at most 512 characters."""
    if not isinstance(scope, str) or not scope or len(scope) > 512:
        raise ConfigurationError("a cooldown scope must be a non-empty string of at most 512 characters")
    return scope


def check_until(until: object) -> datetime:
    """Validate an eligible time: an aware datetime; returned in UTC."""
    if not isinstance(until, datetime) or until.tzinfo is None or until.utcoffset() is None:
        raise ConfigurationError("a cooldown time must be an aware datetime")
    return until.astimezone(timezone.utc)
