"""The deferral: a structured "not now, but at this time" answer, and its JSON form.

Times are wall-clock UTC only (nothing monotonic or process-local), so a deferral
survives a process restart and can be resumed on another machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from .errors import InvalidDeferral
from .policy import DEFER_REASONS, Reason

#: Version of the JSON form written by :meth:`Deferral.to_dict`.
#:
#: The rule: a version adds reasons or optional fields, never removes or renames one,
#: so every reader accepts every version up to its own and writes its own. Version 3
#: added the reason ``rate``; version 2 the reasons ``attempts``, ``quota`` and
#: ``concurrency``; version 1 documents (the reasons ``deadline``, ``max_wait``,
#: ``cooldown``, ``cancelled``, ``cooldown-unknown``) read unchanged.
FORMAT_VERSION = 3

#: Every version :meth:`Deferral.from_dict` reads.
READABLE_VERSIONS = frozenset({1, 2, 3})

#: The reasons a call can be deferred, by the JSON version that introduced them.
REASONS = frozenset(DEFER_REASONS)
_REASONS_BY_VERSION = {
    1: frozenset(
        {Reason.DEADLINE, Reason.MAX_WAIT, Reason.COOLDOWN, Reason.CANCELLED, Reason.COOLDOWN_UNKNOWN}
    ),
    2: REASONS - {Reason.RATE},
    3: REASONS,
}


@dataclass(frozen=True)
class Deferral:
    """When a deferred call may be tried again, and why it was deferred.

    - ``eligible_at``: aware UTC datetime; no attempt should be sent before it.
    - ``delay``: seconds from the decision to ``eligible_at``.
    - ``reason``: ``"deadline"``, ``"max_wait"``, ``"cooldown"``, ``"cancelled"`` or
      ``"cooldown-unknown"`` (the shared store was unreachable and the adapter fails closed).
    - ``scope``: the cooldown scope (an origin, or a hashed caller-defined key).
    - ``attempts``: requests sent so far in the whole job (resumed calls included).
    - ``deferrals``: deferrals so far in the job, this one included.
    - ``status``: HTTP status of the last response, or None.
    - ``retry_after``: the raw Retry-After value of the last response, or None.
    - ``clock_skew``: seconds, local receipt time minus the server's Date, or None.
    - ``started_at``: aware UTC time of the job's first attempt (for lifetime caps).
    - ``history``: the earlier deferrals of the job, oldest first.
    - ``priority``: the call's place among waiters of its scope
      (``budget(priority=...)``; 0: ordinary).
    """

    eligible_at: datetime
    delay: float
    reason: Reason
    scope: str | None = None
    attempts: int = 0
    deferrals: int = 1
    status: int | None = None
    retry_after: str | None = None
    clock_skew: float | None = None
    started_at: datetime | None = None
    history: tuple[Deferral, ...] = field(default=(), repr=False)
    priority: int = 0

    def __post_init__(self) -> None:
        _check_aware("eligible_at", self.eligible_at)
        if self.started_at is not None:
            _check_aware("started_at", self.started_at)
        if not isinstance(self.reason, str) or self.reason not in REASONS:
            raise InvalidDeferral(f"unknown deferral reason {self.reason!r}")
        object.__setattr__(self, "reason", Reason(self.reason))
        _check_numbers(self)
        # Normalise to UTC so equality and JSON round trips are exact.
        object.__setattr__(self, "eligible_at", _utc("eligible_at", self.eligible_at))
        if self.started_at is not None:
            object.__setattr__(self, "started_at", _utc("started_at", self.started_at))

    def chain(self) -> tuple[Deferral, ...]:
        """Every deferral of the job, oldest first, this one last (without its history)."""
        return (*self.history, replace(self, history=()))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (stable, versioned): times as ISO 8601 UTC strings;
        ``priority`` only when it is not 0."""
        return {
            "version": FORMAT_VERSION,
            "eligible_at": _iso(self.eligible_at),
            "delay": self.delay,
            "reason": str(self.reason),
            "scope": self.scope,
            "attempts": self.attempts,
            "deferrals": self.deferrals,
            "status": self.status,
            "retry_after": self.retry_after,
            "clock_skew": self.clock_skew,
            "started_at": None if self.started_at is None else _iso(self.started_at),
            "history": [entry._flat_dict() for entry in self.history],
        } | ({"priority": self.priority} if self.priority else {})

    def _flat_dict(self) -> dict[str, Any]:
        data = self.to_dict()
        del data["history"], data["version"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Deferral:
        """Rebuild a deferral written by :meth:`to_dict`; raises ``InvalidDeferral``."""
        if not isinstance(data, dict):
            raise InvalidDeferral("a deferral must be a JSON object")
        version = data.get("version")
        if type(version) is not int or version not in READABLE_VERSIONS:
            raise InvalidDeferral(f"unsupported deferral version {version!r}")
        history = data.get("history", [])
        if not isinstance(history, list):
            raise InvalidDeferral("history must be a list")
        entries = tuple(cls._from_flat(item) for item in history)
        deferral = replace(cls._from_flat(data), history=entries)
        for entry in (*entries, deferral):
            if entry.reason not in _REASONS_BY_VERSION[version]:
                raise InvalidDeferral(f"reason {str(entry.reason)!r} is not part of version {version}")
        if len(entries) != deferral.deferrals - 1:
            # An edited count would hand a job a fresh max_deferrals budget.
            raise InvalidDeferral("history must hold exactly deferrals - 1 earlier deferrals")
        return deferral

    @classmethod
    def _from_flat(cls, data: Any) -> Deferral:
        if not isinstance(data, dict):
            raise InvalidDeferral("a deferral must be a JSON object")
        try:
            _check_json_types(data)
            started = data.get("started_at")
            return cls(
                eligible_at=_parse_iso("eligible_at", data["eligible_at"]),
                delay=data["delay"],
                reason=data["reason"],
                scope=data.get("scope"),
                attempts=data["attempts"],
                deferrals=data["deferrals"],
                status=data.get("status"),
                retry_after=data.get("retry_after"),
                clock_skew=data.get("clock_skew"),
                started_at=None if started is None else _parse_iso("started_at", started),
                priority=data.get("priority", 0),
            )
        except KeyError as missing:
            raise InvalidDeferral(f"missing field {missing.args[0]!r}") from None


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _integer(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_numbers(deferral: Deferral) -> None:
    """The numeric fields' ranges (seconds, counts, an HTTP status)."""
    if not _number(deferral.delay) or not _finite(deferral.delay) or deferral.delay < 0:
        raise InvalidDeferral("delay must be a finite number of seconds >= 0")
    skew = deferral.clock_skew
    if skew is not None and not (_number(skew) and _finite(skew)):
        raise InvalidDeferral("clock_skew must be a finite number of seconds or None")
    status = deferral.status
    if status is not None and not (_integer(status) and 100 <= status <= 999):
        raise InvalidDeferral("status must be an HTTP status code (100-999) or None")
    if not (isinstance(deferral.attempts, int) and deferral.attempts >= 0):
        raise InvalidDeferral("attempts must be an int >= 0")
    if not (isinstance(deferral.deferrals, int) and deferral.deferrals >= 1):
        raise InvalidDeferral("deferrals must be an int >= 1")
    if not (_integer(deferral.priority) and -(2**31) <= deferral.priority < 2**31):
        raise InvalidDeferral("priority must be an int from -2**31 to 2**31 - 1")


def _string(value: object) -> bool:
    return isinstance(value, str)


#: The JSON types of a deferral's fields: (name, test, what the message says it must
#: be, how a missing field is met: "required" raises KeyError, "typed" is tested as
#: null, "nullable" may be missing or null).
_JSON_TYPES: tuple[tuple[str, Callable[[object], bool], str, str], ...] = (
    ("delay", _number, "a number", "required"),
    ("reason", _string, "a string", "typed"),
    ("clock_skew", _number, "a number or null", "nullable"),
    ("status", _integer, "an int or null", "nullable"),
    ("retry_after", _string, "a string or null", "nullable"),
    ("scope", _string, "a string or null", "nullable"),
    ("attempts", _integer, "an int", "required"),
    ("deferrals", _integer, "an int", "required"),
)


def _check_json_types(data: dict[str, Any]) -> None:
    """Each field of a deferral's JSON of its type (a missing required one: KeyError)."""
    for name, test, kind, missing in _JSON_TYPES:
        value = data[name] if missing == "required" else data.get(name)
        if not (missing == "nullable" and value is None) and not test(value):
            raise InvalidDeferral(f"{name} must be {kind}")


def deferral_of(thing: object) -> Deferral | None:
    """The deferral carried by a response or an exception, or None.

    Finds it on a response from :class:`~retry_after_adapter.RetryAfterAdapter` or
    :class:`~retry_after_adapter.RetryAfterPoolManager` (None when the call was not
    deferred, or the response did not come through either), on ``RetryDeferred`` and
    ``MaxRetryDeferred``, and anywhere in an exception's chain (``__cause__``,
    ``__context__``, ``args``, urllib3's ``reason``): the ``RetryError`` or
    ``ConnectionError`` a *stock* ``HTTPAdapter`` raises around a deferral of
    :class:`~retry_after_adapter.RetryAfterRetry`, for instance; and on the
    ``response`` an exception holds: the OpenAI and Anthropic SDKs' ``RateLimitError``
    and ``APIStatusError`` over the httpx2 transports (their ``APIConnectionError``
    has the transport's error as its cause).
    """
    stack: list[object] = [thing]
    seen: set[int] = set()
    while stack and len(seen) < 32:
        current = stack.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        found = getattr(current, "deferral", None)
        if isinstance(found, Deferral):
            return found
        if isinstance(current, BaseException):
            held = getattr(current, "response", None)
            if held is not None and isinstance(getattr(held, "deferral", None), Deferral):
                return held.deferral  # type: ignore[no-any-return]
            stack.extend(
                item
                for item in (
                    *current.args,
                    getattr(current, "reason", None),
                    current.__context__,
                    current.__cause__,
                )
                if isinstance(item, BaseException)
            )
    return None


def _finite(value: object) -> bool:
    if not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int too large for a float
        return False


def _utc(name: str, value: datetime) -> datetime:
    try:
        return value.astimezone(timezone.utc)
    except OverflowError:
        raise InvalidDeferral(f"{name} is out of range once converted to UTC") from None


def _check_aware(name: str, value: object) -> None:
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise InvalidDeferral(f"{name} must be an aware datetime")


def _iso(value: datetime) -> str:
    return value.astimezone(timezone.utc).isoformat()


def _parse_iso(name: str, text: Any) -> datetime:
    if not isinstance(text, str):
        raise InvalidDeferral(f"{name} must be an ISO 8601 string")
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidDeferral(f"{name} is not an ISO 8601 time") from None
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidDeferral(f"{name} must carry a UTC offset")
    return _utc(name, value)
