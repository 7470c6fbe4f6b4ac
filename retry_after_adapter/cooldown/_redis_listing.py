"""The operator's view of :class:`~.redis.RedisCooldownStore` (the ``Listing``
capability): what is stored, what holds each scope back, and lifting it. A mixin of
the store; SCAN throughout, so that the server is never blocked."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ..errors import CooldownStoreError
from ._ms import from_epoch_ms, now_epoch_ms
from ._redis_wire import _OPEN, _RATE, _RATE_FIELDS, _TOKENS, _glob, _learned_rate, _slot_string, _text
from .allowance import Allowance, roll
from .base import Hold, check_scope, token_scope
from .rate import rate_holds

#: How long (ms) the mark ``delete`` leaves outlives the cooldown it lifted (as the
#: cooldown's key outlives its cooldown).
LIFTED_KEPT_MS = 60_000


class RedisListing:
    """``delete``, ``holds`` and ``entries`` of the Redis store."""

    _client: Any
    _prefix: str
    _channel: str

    if TYPE_CHECKING:  # the store's own

        def key(self, scope: str) -> str: ...

        def get(self, scope: str) -> datetime | None: ...

        def companion(self, scope: str, name: str) -> str: ...

        def _failure(self, operation: str, exc: BaseException) -> CooldownStoreError: ...

    def delete(self, scope: str) -> bool:
        """Lift everything that holds ``scope`` back (an operator clearing it): its
        cooldown, announced allowance, every quota's permits and its concurrency leases
        (one ``DEL`` per key: they may live in two cluster slots); True if there was
        any of them. First it marks the scope lifted (``{<key>}lifted``, living until the
        cooldown it lifts ends and a minute more): a process that still holds that
        cooldown then reads it as lifted, not as lost with the store's data (see
        ``lifted``)."""
        key = self.key(check_scope(scope))
        tag, _ = _slot_string(key)
        if tag == key:  # {key}quota:L/P, {key}tokens:L/P
            quotas = _glob(self.companion(scope, "quota:")) + "*"
            tokens = _glob(self.companion(scope, "tokens:")) + "*"
        else:  # {tag}quota:L/P:key, {tag}tokens:L/P:key
            quotas = "{" + _glob(tag) + "}quota:*:" + _glob(key)
            tokens = "{" + _glob(tag) + "}tokens:*:" + _glob(key)
        try:
            keys = [key, self.companion(scope, "allowance"), self.companion(scope, "lease")]
            keys += [self.companion(scope, _TOKENS), self.companion(scope, _RATE)]
            keys += self._companions(scope, tokens) + self._companions(scope, quotas)
            if self._channel:
                # Once before (a client that may not PUBLISH deletes nothing: no near copy
                # misses it), once after (a copy that read the scope meanwhile reads again).
                self._client.publish(self._channel, "d 0 " + scope)
            self._mark_lifted(scope, key)
            found = sum(int(self._client.delete(name)) for name in keys) > 0
            if self._channel:
                self._client.publish(self._channel, "d 0 " + scope)
            return found
        except Exception as exc:
            raise self._failure("delete", exc) from exc

    def _mark_lifted(self, scope: str, key: str) -> None:
        """Mark ``scope`` lifted until its cooldown (stored under ``key``) ends, and
        :data:`LIFTED_KEPT_MS` more."""
        raw = self._client.get(key)
        try:
            until = int(raw) if raw is not None else 0
        except (TypeError, ValueError):
            until = 0
        kept = max(0, until - now_epoch_ms(datetime.now(timezone.utc))) + LIFTED_KEPT_MS
        self._client.set(self.companion(scope, "lifted"), "1", px=kept)

    def _companions(self, scope: str, pattern: str) -> list[str]:
        """The keys SCAN finds for ``pattern`` that are ``scope``'s own companions (the
        pattern of a key with a hash tag of its own also matches another scope's whose
        key ends in ``:<key>``)."""
        found = (_text(raw) for raw in self._client.scan_iter(match=pattern, count=1000))
        return [name for name in found if (self._companion_of(name) or ("",))[0] == scope]

    def holds(self, now: datetime | None = None) -> dict[str, list[Hold]]:
        """Every scope held back at ``now`` (default: the present) and by what (see
        ``MemoryCooldownStore.holds``): SCANs this prefix's keys, so it does not block
        the server (a key changed meanwhile may be missed or stale)."""
        now = now if now is not None else datetime.now(timezone.utc)
        now_ms = now_epoch_ms(now)
        found: dict[str, list[Hold]] = {}
        for scope, until in self.entries().items():
            if until > now:
                found.setdefault(scope, []).append(Hold("cooldown", until))
        prefix = self._glob_prefix()
        try:
            for raw in (
                key
                for pattern in ("{" + prefix + "*}*", "{*}*:" + prefix + "*")
                for key in self._client.scan_iter(match=pattern, count=1000)
            ):
                named = self._companion_of(_text(raw))
                if named is None:
                    continue
                scope, name = named
                hold = self._hold(_text(raw), name, now, now_ms)
                if hold is not None:
                    # The announced token allowance under its own scope, as the other stores keep it.
                    found.setdefault(token_scope(scope) if name == _TOKENS else scope, []).append(hold)
        except Exception as exc:
            raise self._failure("holds", exc) from exc
        return found

    def _companion_of(self, key: str) -> tuple[str, str] | None:
        """``(scope, name)`` of a companion key of this store (see :meth:`companion`), or
        None for any other key."""
        end = key.find("}")
        if not key.startswith("{") or end < 0:
            return None
        tag, rest = key[1:end], key[end + 1 :]
        marker = ":" + self._prefix
        if tag.startswith(self._prefix) and marker not in rest:
            scope, name = tag[len(self._prefix) :], rest
        elif marker in rest:
            name, _, full = rest.partition(marker)
            scope = full
        else:
            return None
        if not scope or self.companion(scope, name) != key:
            return None  # a record of another prefix that matched the pattern
        return scope, name

    def _hold(self, key: str, name: str, now: datetime, now_ms: int) -> Hold | None:
        """What the companion record ``key`` (its ``name``) holds its scope back with."""
        if name in ("allowance", _TOKENS):
            return self._allowance_hold(key, now)
        if name == "lease":
            live = self._client.zrangebyscore(key, f"({now_ms}", "+inf", withscores=True)
            return Hold("leases", from_epoch_ms(int(live[-1][1])), len(live)) if live else None
        if name == _RATE:
            return self._rate_hold(key, now_ms)
        if name.startswith("tokens:"):
            limit = int(name[len("tokens:") :].split("/", 1)[0])
            live = self._client.zrangebyscore(key, f"({now_ms}", "+inf", withscores=True)
            weight = sum(int(_text(member).rsplit(":", 1)[1]) for member, _ in live)
            return Hold("tokens", from_epoch_ms(int(live[0][1])), limit) if weight >= limit else None
        if name.startswith("quota:") and not name.endswith(_OPEN):
            limit = int(name[len("quota:") :].split("/", 1)[0])
            live = self._client.zrangebyscore(key, f"({now_ms}", "+inf", withscores=True)
            if len(live) >= limit:
                return Hold("quota", from_epoch_ms(int(live[len(live) - limit][1])), limit)
        return None

    def _allowance_hold(self, key: str, now: datetime) -> Hold | None:
        fields = self._client.hmget(key, ["r", "a", "u", "n", "l", "w", "x"])
        if fields[3] is None:
            return None
        left, at, until, count, lim, window = (int(float(_text(v or 0))) for v in fields[:6])
        record = Allowance(left, at, from_epoch_ms(until), count, lim, window / 1000, fields[6] == b"1")
        rolled = roll(record, now)
        return Hold("allowance", rolled.until) if rolled.until > now and rolled.remaining <= 0 else None

    def _rate_hold(self, key: str, now_ms: int) -> Hold | None:
        rate = _learned_rate(self._client.hmget(key, list(_RATE_FIELDS)))
        if rate is None:
            return None
        ends = rate_holds(rate, now_ms / 1000)
        return None if ends is None else Hold("rate", from_epoch_ms(round(ends * 1000)), rate.limit)

    def entries(self) -> dict[str, datetime]:
        """Every scope under this store's prefix and its eligible time (SCAN, so it
        does not block the server; a key changed meanwhile may be missed or stale)."""
        pattern = self._glob_prefix() + "*"
        found: dict[str, datetime] = {}
        try:
            keys = list(self._client.scan_iter(match=pattern, count=1000))
            for key in keys:
                raw = self._client.get(key)  # one key at a time: no cross-slot MGET on a cluster
                name = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
                try:
                    found[name[len(self._prefix) :]] = from_epoch_ms(int(raw))
                except (TypeError, ValueError):
                    continue  # gone meanwhile, or not a time: not a cooldown
        except Exception as exc:
            raise self._failure("entries", exc) from exc
        return found

    def _glob_prefix(self) -> str:
        """The key prefix as a SCAN pattern that matches it literally."""
        return _glob(self._prefix)

