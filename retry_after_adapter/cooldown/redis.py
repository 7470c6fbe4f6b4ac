"""A cooldown store in Redis or Valkey, shared by processes on every machine.

One key per scope (``prefix + scope``) holds the eligible time as UTC epoch
milliseconds. The later-wins extend is a server-side Lua script: one round trip, atomic,
touching a single key (so it works on a cluster without cross-slot operations). Each
key expires a minute after its cooldown ends, so expired cooldowns clean themselves up.

``redis`` (redis-py) is an optional dependency: this module never imports it at import
time; only :meth:`RedisCooldownStore.from_url` does, when called.
"""

from __future__ import annotations

import math
import re
import secrets
from datetime import datetime, timezone
from typing import Any

from ..errors import ConfigurationError, CooldownStoreError
from .allowance import ALLOWANCE_KEPT, SAME_WINDOW, Allowance, roll
from .base import Admission, Granted, Hold, check_scope, check_until
from .freshness import Freshness, check_outcome
from .sqlite import from_epoch_ms, now_epoch_ms, to_epoch_ms

#: The default connect and reply timeouts (seconds) of a client made by ``from_url``.
DEFAULT_SOCKET_TIMEOUT = 0.1

#: How long (ms) a key outlives its cooldown before Redis deletes it.
GRACE_MS = 60_000

#: KEYS[1] = the scope's key; ARGV[1] = the new time and ARGV[2] = when the key may go
#: (both epoch ms, as decimal strings computed by the caller: no number formatting in
#: Lua). Keeps max(stored, new); a stored value that is not a number is replaced. Returns
#: the effective time. SET + PEXPIREAT (not SET PXAT) so old Redis and Valkey run it.
_EXTEND_LUA = """
local new = tonumber(ARGV[1])
local stored = tonumber(redis.call('GET', KEYS[1]))
if stored ~= nil and stored >= new then
  return stored
end
redis.call('SET', KEYS[1], ARGV[1])
redis.call('PEXPIREAT', KEYS[1], ARGV[2])
return new
"""

#: One quota's permits on the scope's permit set KEYS[1] (a sorted set, score = when a
#: permit stops counting: its grant + per + margin, epoch ms). ``take_permit`` drops
#: the permits that stopped counting and grants one if fewer than the limit remain
#: (-1), else returns when one will be free; the key lives as long as its last permit.
_PERMIT_LUA = """
local function take_permit(key, now, counts, limit, member, take)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  local count = redis.call('ZCARD', key)
  if count >= limit then
    local edge = redis.call('ZRANGE', key, count - limit, count - limit, 'WITHSCORES')
    return tonumber(edge[2])
  end
  if take then
    redis.call('ZADD', key, now + counts, member)
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', key, tonumber(last[2]) + 1000)
  end
  return -1
end
"""

#: KEYS[1] = the quota's permit set; ARGV = now (ms), how long a permit counts (ms),
#: the limit and a unique member.
_ACQUIRE_LUA = (
    _PERMIT_LUA
    + """
return take_permit(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4], true)
"""
)

#: KEYS[1] = a quota's permit set; ARGV = the answer's time (ms), the quota's per (ms),
#: the permit's stored expiry (ms) and a member for it should it be gone: that permit
#: (any one with that expiry; put back if it expired meanwhile) counts until at least
#: the answer + per; the key lives as long as its last permit.
_SETTLE_LUA = """
local new = tonumber(ARGV[1]) + tonumber(ARGV[2])
local old = tonumber(ARGV[3])
if new <= old then return 0 end
local found = redis.call('ZRANGEBYSCORE', KEYS[1], old, old, 'LIMIT', 0, 1)
local member = ARGV[4]
if #found > 0 then member = found[1] end
redis.call('ZADD', KEYS[1], new, member)
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
redis.call('PEXPIREAT', KEYS[1], tonumber(last[2]) + 1000)
return 1
"""

#: The allowance rules of ``allowance.py`` in Lua, shared by the two scripts below. The
#: hash has r (left), a (as of admission), u (until, epoch ms, kept as the decimal
#: string it came as), n (admitted), l (limit, 0: unknown), w (window ms, 0: unknown)
#: and x ("1": exact). ``roll`` starts the server's next window past the reset.
_ALLOWANCE_LUA = """
local function load(key)
  local h = redis.call('HMGET', key, 'r', 'a', 'u', 'n', 'l', 'w', 'x')
  if h[4] == false then return nil end
  return {r = tonumber(h[1]), a = tonumber(h[2]), u = tonumber(h[3]), n = tonumber(h[4]),
          l = tonumber(h[5]) or 0, w = tonumber(h[6]) or 0, x = h[7] == '1'}
end
local function save(key, rec, kept)
  redis.call('HSET', key, 'r', rec.r, 'a', rec.a, 'u', string.format('%d', rec.u), 'n', rec.n,
             'l', rec.l, 'w', rec.w, 'x', rec.x and '1' or '0')
  redis.call('PEXPIREAT', key, rec.u + kept)
end
local function roll(rec, now)
  if rec.u > now or rec.l <= 0 then return false end
  if rec.w <= 0 then
    if rec.x then return false end
    rec.r = rec.l
    rec.a = rec.n
    rec.x = true
    return true
  end
  local periods = math.floor((now - rec.u) / rec.w) + 1
  rec.u = rec.u + periods * rec.w
  rec.r = rec.l
  rec.a = rec.n
  rec.x = true
  return true
end
"""

#: Admission for one attempt, atomically, all or nothing (``MemoryCooldownStore.admit``).
#: KEYS = the cooldown key, the quota's permit set, the allowance hash, the lease set,
#: all in one cluster slot; ARGV = now (ms; the client's clock: cooldowns are stamped so),
#: how long a permit counts (ms, 0: no quota), the limit, a unique member, "1" to read
#: the cooldown from KEYS[1] ("0": the caller read it), how long (ms) an allowance
#: outlives its reset, and the slots (0: no cap), the lease's ttl (ms) and its token.
#: Returns {cooldown or -1, -1 when admitted or when to ask again, the admission number
#: or -1, 1 when only a slot was missing, when the permit taken stops counting or -1}.
_ADMIT_LUA = (
    _PERMIT_LUA
    + _ALLOWANCE_LUA
    + """
local now = tonumber(ARGV[1])
local cooldown = -1
if ARGV[5] == '1' then
  local stored = tonumber(redis.call('GET', KEYS[1]))
  if stored ~= nil then
    if stored > now then return {stored, stored, -1, 0, -1} end
    cooldown = stored
  end
end
local rec = load(KEYS[3])
if rec ~= nil then
  local rolled = roll(rec, now)
  if rec.u > now and rec.r - (rec.n - rec.a) <= 0 then
    if rolled then save(KEYS[3], rec, tonumber(ARGV[6])) end
    return {cooldown, rec.u, -1, 0, -1}
  end
end
local counts = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
if counts > 0 then
  local refused = take_permit(KEYS[2], now, counts, limit, ARGV[4], false)
  if refused >= 0 then return {cooldown, refused, -1, 0, -1} end
end
local slots = tonumber(ARGV[7])
if slots > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  if redis.call('ZCARD', KEYS[4]) >= slots then
    local first = redis.call('ZRANGE', KEYS[4], 0, 0, 'WITHSCORES')
    return {cooldown, tonumber(first[2]), -1, 1, -1}
  end
  redis.call('ZADD', KEYS[4], now + tonumber(ARGV[8]), ARGV[9])
  redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[8]) + 1000)
end
local permit = -1
if counts > 0 then
  take_permit(KEYS[2], now, counts, limit, ARGV[4], true)
  permit = now + counts
end
if rec == nil then return {cooldown, -1, -1, 0, permit} end
rec.n = rec.n + 1
save(KEYS[3], rec, tonumber(ARGV[6]))
return {cooldown, -1, rec.n - 1, 0, permit}
"""
)

#: KEYS[1] = the allowance hash; ARGV = remaining, until, now (epoch ms), the
#: answered attempt's admission number (-1: none), the limit and the window (ms; 0:
#: not said), the same-window tolerance and how long a record outlives its reset (ms).
#: ``allowance.merge_allowance`` in Lua.
_ALLOW_LUA = (
    _ALLOWANCE_LUA
    + """
local remaining = math.max(0, tonumber(ARGV[1]))
local untl, now, seq = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local lim, win, same, kept = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
if untl <= now then return 0 end
local rec = load(KEYS[1])
if rec ~= nil then
  if lim <= 0 then lim = rec.l end
  if win <= 0 then win = rec.w end
  local gap = untl - rec.u
  if win <= 0 and gap > same and now - rec.u < gap / 2 then win = math.floor(gap / 1000 + 0.5) * 1000 end
  roll(rec, now)
end
local count = 0
if rec ~= nil then count = rec.n end
local at = count
if seq >= 0 then at = math.min(seq + 1, count) end
if rec ~= nil and rec.u <= now and rec.x and lim > 0 then
  local left = math.min(remaining, rec.r - (rec.n - rec.a))
  save(KEYS[1], {r = left, a = count, u = untl, n = count, l = lim, w = win, x = true}, kept)
  return 1
end
if rec == nil or rec.u <= now then
  save(KEYS[1], {r = remaining, a = at, u = untl, n = count, l = lim, w = win, x = false}, kept)
  return 1
end
local gap = untl - rec.u
if gap > same then
  save(KEYS[1], {r = remaining, a = at, u = untl, n = count, l = lim, w = win, x = false}, kept)
  return 1
end
if gap < -same then return 0 end
if untl < rec.u then rec.u = untl end
rec.l = lim
rec.w = win
if lim > 0 then at = count end
if not rec.x and remaining - (count - at) < rec.r - (rec.n - rec.a) then
  rec.r = remaining
  rec.a = at
end
save(KEYS[1], rec, kept)
return 1
"""
)

#: KEYS[1] = the scope's lease set (score = expiry, epoch ms); ARGV = now (ms), the
#: lease's ttl (ms), the limit and the token. Drops expired leases, grants one if fewer
#: than the limit are held (-1), else returns the earliest expiry.
_LEASE_LUA = """
local now = tonumber(ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[3]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[4])
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) + 1000)
  return -1
end
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return tonumber(first[2])
"""

#: KEYS[1] = the scope's freshness hash (s = last success, e = last error class, t =
#: its time; epoch ms; k = the scope); ARGV = the outcome, its time (ms), how long (ms)
#: the record is kept after its last note, and the scope. Later news wins.
_NOTE_LUA = """
local at = tonumber(ARGV[2])
redis.call('HSET', KEYS[1], 'k', ARGV[4])
if ARGV[1] == 'success' then
  local s = tonumber(redis.call('HGET', KEYS[1], 's'))
  if s == nil or at > s then redis.call('HSET', KEYS[1], 's', ARGV[2]) end
else
  local t = tonumber(redis.call('HGET', KEYS[1], 't'))
  if t == nil or at >= t then redis.call('HSET', KEYS[1], 'e', ARGV[1], 't', ARGV[2]) end
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

#: Milliseconds a freshness record is kept after its last note (30 days).
FRESHNESS_KEPT_MS = 30 * 24 * 3600 * 1000

_INSTALL_HINT = "pip install 'retry_after_adapter[redis]' (from a checkout: pip install -e '.[redis]')"

_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")
_GLOB_SPECIAL = re.compile(r"[*?\[\]\\]")


def _glob(text: str) -> str:
    """``text`` as a SCAN pattern that matches it literally."""
    return _GLOB_SPECIAL.sub(r"\\\g<0>", text)


def _present(now: datetime | None) -> datetime:
    """``now`` checked, or this host's present."""
    return datetime.now(timezone.utc) if now is None else check_until(now)


def _counts_ms(per: float, margin: float) -> int:
    """How long (ms) a permit of a quota of ``per`` seconds counts: ``per + margin``."""
    return max(1, math.ceil(per * 1000)) + math.ceil(margin * 1000)


def _restore(url: str, prefix: str, client_kwargs: dict[str, Any]) -> RedisCooldownStore:
    return RedisCooldownStore.from_url(url, prefix=prefix, **client_kwargs)


class RedisCooldownStore:
    """Cooldowns shared by every process on every machine through Redis or Valkey.

    ``client`` is any synchronous redis-py compatible client: ``redis.Redis``,
    ``redis.RedisCluster``, ``valkey.Valkey``... It should have short socket timeouts
    and few retries (see :meth:`from_url`), so a store outage costs a call a fraction
    of a second rather than hanging it. ``prefix`` is prepended to each scope to make
    its key. ``timeout`` (seconds) is how long one operation can take at most; by
    default it is read from a ``redis.Redis`` client's connect and socket timeouts. A
    store without a known bound has each operation run on a helper thread of the
    failure layer, bounded there (a little slower).

    ``get`` is one ``GET``; ``extend`` is one ``EVALSHA`` (the script is loaded again by
    the client after a server restart). Times are whole UTC epoch milliseconds, rounded
    up, so machines agree and a cooldown never ends earlier than asked. Any error of
    the client (connection refused, timeout, authentication, a wrong key type...) is
    raised as :class:`CooldownStoreError`, whose message never contains the server's
    URL credentials.
    """

    #: ``admit`` stamps a permit with the time it grants it (``now`` None: the present
    #: read inside the operation) and keeps each quota's log and each permit's margin.
    stamps_grants = True

    def __init__(self, client: Any, *, prefix: str = "retry-after:", timeout: float | None = None) -> None:
        if not isinstance(prefix, str):
            raise ConfigurationError("the Redis cooldown key prefix must be a str")
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not (math.isfinite(timeout) and timeout > 0)
        ):
            raise ConfigurationError("the Redis cooldown timeout must be a finite number of seconds > 0")
        for method in ("get", "register_script"):
            if not callable(getattr(client, method, None)):
                raise ConfigurationError(
                    f"the Redis cooldown store needs a redis-py compatible client (no {method}())"
                )
        self._client = client
        self._prefix = prefix
        self._timeout = float(timeout) if timeout is not None else _client_timeout(client)
        self._secrets = _client_secrets(client)
        try:
            self._script = client.register_script(_EXTEND_LUA)  # local: no round trip
            self._acquire_script = client.register_script(_ACQUIRE_LUA)
            self._lease_script = client.register_script(_LEASE_LUA)
            self._admit_script = client.register_script(_ADMIT_LUA)
            self._allow_script = client.register_script(_ALLOW_LUA)
            self._note_script = client.register_script(_NOTE_LUA)
            self._settle_script = client.register_script(_SETTLE_LUA)
        except Exception as exc:
            raise self._failure("register_script", exc) from exc
        self._url_args: tuple[str, dict[str, Any]] | None = None

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "retry-after:",
        socket_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        socket_connect_timeout: float = DEFAULT_SOCKET_TIMEOUT,
        **client_kwargs: Any,
    ) -> RedisCooldownStore:
        """A store with its own ``redis.Redis`` client made from ``url``.

        ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (TLS) and
        ``unix://`` as redis-py reads them; ``valkey://`` and ``valkeys://`` are read as
        ``redis://`` and ``rediss://``. The client gets 0.1 s socket and connect timeouts
        (a Redis on the same network answers in about a millisecond) and retries a
        command once, at once, only after a connection error (a pooled connection the
        server dropped), never after a timeout: a hung or unreachable server fails an
        operation within about 0.2 s, and the failure layer then skips it for a while.
        Other keyword arguments go to redis-py.

        Needs the ``redis`` extra: ``pip install 'retry_after_adapter[redis]'`` (from a
        checkout, ``pip install -e '.[redis]'``).
        """
        if not isinstance(url, str):
            raise ConfigurationError("a Redis cooldown URL must be a str")
        for name, value in (
            ("socket_timeout", socket_timeout),
            ("socket_connect_timeout", socket_connect_timeout),
        ):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float))
                or not (math.isfinite(value) and value > 0)
            ):
                raise ConfigurationError(f"{name} must be a finite number of seconds > 0")
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError:
            raise ConfigurationError(
                f"the Redis cooldown store needs the redis package: {_INSTALL_HINT}"
            ) from None
        kwargs: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": socket_connect_timeout,
        }
        if "retry" not in client_kwargs:
            kwargs["retry"] = Retry(NoBackoff(), 1, supported_errors=(redis.ConnectionError,))
        kwargs.update(client_kwargs)
        try:
            client = redis.Redis.from_url(_as_redis_url(url), **kwargs)
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(
                f"invalid Redis cooldown URL {redact_url(url)!r}: {_scrub(str(exc), _url_secrets(url))}"
            ) from None
        store = cls(client, prefix=prefix)
        options = dict(
            client_kwargs, socket_timeout=socket_timeout, socket_connect_timeout=socket_connect_timeout
        )
        store._url_args = (url, options)
        return store

    @property
    def client(self) -> Any:
        """The underlying client."""
        return self._client

    @property
    def timeout(self) -> float | None:
        """The most (seconds) one operation can take: connect plus reply timeouts, or
        what was given; None when unknown."""
        return self._timeout

    @property
    def prefix(self) -> str:
        return self._prefix

    def key(self, scope: str) -> str:
        """The Redis key that holds ``scope``'s cooldown."""
        return self._prefix + scope

    def get(self, scope: str) -> datetime | None:
        key = self.key(check_scope(scope))
        try:
            raw = self._client.get(key)
        except Exception as exc:  # any client's errors: redis, valkey, cluster, socket
            raise self._failure("get", exc) from exc
        if raw is None:
            return None
        try:
            ms = int(raw)
        except (TypeError, ValueError):
            raise CooldownStoreError(
                f"the Redis cooldown key for this scope holds a value that is not a time "
                f"(prefix {self._prefix!r})"
            ) from None
        return from_epoch_ms(ms)

    def extend(self, scope: str, until: datetime) -> datetime:
        key = self.key(check_scope(scope))
        ms = to_epoch_ms(check_until(until))
        try:
            effective = self._script(keys=[key], args=[str(ms), str(ms + GRACE_MS)])
        except Exception as exc:
            raise self._failure("extend", exc) from exc
        try:
            return from_epoch_ms(int(effective))
        except (TypeError, ValueError):
            raise CooldownStoreError("the Redis cooldown script returned an unexpected reply") from None

    def companion(self, scope: str, name: str) -> str:
        """The key of ``scope``'s ``name`` record ("quota", "allowance", "lease"): hash
        tagged so that it lives in the cluster slot of the scope's cooldown key (the
        cooldown key unchanged: ``{prefix + scope}name``, or for a key with a hash tag of
        its own ``{tag}name:`` and the key)."""
        key = self.key(scope)
        tag, _ = _slot_string(key)
        if tag == key:
            return "{" + key + "}" + name
        # The key's own hash tag: the key follows, so that prefixes never share a key.
        return "{" + tag + "}" + name + ":" + key

    def quota_key(self, scope: str, limit: int, per: float) -> str:
        """The permit set of the quota ``limit`` per ``per`` seconds of ``scope`` (one
        per quota, so two quotas on one scope each hold; see :meth:`companion`)."""
        return self.companion(scope, f"quota:{int(limit)}/{max(1, math.ceil(per * 1000))}")

    def acquire(
        self, scope: str, limit: int, per: float, now: datetime | None = None, margin: float = 0.0
    ) -> datetime | None:
        """Take a quota permit (see ``MemoryCooldownStore.admit``): one ``EVALSHA`` on
        the quota's permit set (:meth:`quota_key`); ``now`` None: this host's clock, read
        right before the script."""
        key = self.quota_key(check_scope(scope), limit, per)
        now_arg = str(now_epoch_ms(_present(now)))
        counts = _counts_ms(per, margin)
        args = [now_arg, counts, limit, secrets.token_hex(8)]
        return self._admission("acquire", self._acquire_script, key, args)

    def admit(
        self,
        scope: str,
        now: datetime | None,
        limit: int | None = None,
        per: float | None = None,
        lease: tuple[int, float, str] | None = None,
        margin: float = 0.0,
    ) -> Admission:
        """Admission for one attempt (see ``MemoryCooldownStore.admit``): the cooldown,
        the announced allowance, the quota permit and the concurrency slot in one
        ``EVALSHA``, all or nothing, the keys in one cluster slot; ``now`` None: this
        host's clock read right before the script (the clock every cooldown of the store
        is stamped with; Redis's own would mix two clocks). A late answer moves the
        permit later (:meth:`settle`). (A scope
        whose key has a ``}`` that Redis would not read as a hash tag has its cooldown
        read by a ``GET`` before: two round trips.)"""
        key = self.key(check_scope(scope))
        quota = limit is not None and per is not None
        _, together = _slot_string(key)
        stored = None if together else self.get(scope)
        when = _present(now)
        if stored is not None and stored > when:
            return Admission(stored, stored)
        allowance = self.companion(scope, "allowance")
        keys = [
            key if together else allowance,
            self.quota_key(scope, limit, per) if quota else allowance,  # type: ignore[arg-type]
            allowance,
            self.companion(scope, "lease"),
        ]
        slots, ttl_ms, token = (
            (lease[0], max(1, math.ceil(lease[1] * 1000)), lease[2]) if lease else (0, 0, "")
        )
        args = [
            now_epoch_ms(when),
            _counts_ms(per, margin) if quota else 0,  # type: ignore[arg-type]
            limit or 0,
            secrets.token_hex(8) if quota else "",
            "1" if together else "0",
            int(ALLOWANCE_KEPT * 1000),
            slots,
            ttl_ms,
            token,
        ]
        try:
            reply = self._admit_script(keys=keys, args=[str(arg) for arg in args])
        except Exception as exc:
            raise self._failure("admit", exc) from exc
        try:
            cooldown, wait, seq, busy, permit = (int(value) for value in reply)
        except (TypeError, ValueError):
            raise CooldownStoreError("the Redis admit script returned an unexpected reply") from None
        known = (None if cooldown < 0 else from_epoch_ms(cooldown)) if together else stored
        if permit >= 0 and wait < 0:
            return Granted.of(from_epoch_ms(permit), known, None if seq < 0 else seq)
        return Admission(
            known, None if wait < 0 else from_epoch_ms(wait), None if seq < 0 else seq, bool(busy)
        )

    def settle(
        self, scope: str, limit: int, per: float, expires: datetime, now: datetime | None = None
    ) -> None:
        """The attempt whose permit stops counting at ``expires`` was answered at ``now``
        (None: this host's present): the permit counts at least until ``now + per`` (see
        ``MemoryCooldownStore.settle``). One ``EVALSHA``."""
        key = self.quota_key(check_scope(scope), limit, per)
        args = [
            str(now_epoch_ms(_present(now))),
            str(max(1, math.ceil(per * 1000))),
            str(to_epoch_ms(check_until(expires))),
            secrets.token_hex(8),
        ]
        try:
            self._settle_script(keys=[key], args=args)
        except Exception as exc:
            raise self._failure("settle", exc) from exc

    def allow(
        self,
        scope: str,
        remaining: int,
        until: datetime,
        now: datetime,
        seq: int | None = None,
        limit: int | None = None,
        window: float | None = None,
    ) -> None:
        """Record the server's announced allowance (see ``MemoryCooldownStore.allow``):
        one ``EVALSHA`` on the scope's "allowance" key."""
        key = self.companion(check_scope(scope), "allowance")
        args = [
            int(remaining),
            to_epoch_ms(check_until(until)),
            now_epoch_ms(check_until(now)),
            -1 if seq is None else int(seq),
            int(limit) if limit else 0,
            round(window * 1000) if window else 0,
            int(SAME_WINDOW * 1000),
            int(ALLOWANCE_KEPT * 1000),
        ]
        try:
            self._allow_script(keys=[key], args=[str(arg) for arg in args])
        except Exception as exc:
            raise self._failure("allow", exc) from exc

    def note(self, scope: str, outcome: str, at: datetime) -> None:
        """Note a success or an error class (see ``MemoryCooldownStore.note``): one
        ``EVALSHA`` on the scope's "fresh" key."""
        key = self.companion(check_scope(scope), "fresh")
        args = [check_outcome(outcome), str(to_epoch_ms(check_until(at))), str(FRESHNESS_KEPT_MS), scope]
        try:
            self._note_script(keys=[key], args=args)
        except Exception as exc:
            raise self._failure("note", exc) from exc

    def freshness(self, scope: str) -> Freshness | None:
        """The scope's freshness (see ``MemoryCooldownStore.freshness``)."""
        key = self.companion(check_scope(scope), "fresh")
        try:
            fields = self._client.hmget(key, ["s", "e", "t"])
        except Exception as exc:
            raise self._failure("freshness", exc) from exc
        until = self.get(scope)
        if all(value is None for value in fields) and until is None:
            return None
        return _freshness(fields, until)

    def freshness_entries(self) -> dict[str, Freshness]:
        """Every scope's freshness under this prefix (SCAN, as :meth:`entries`)."""
        found = {scope: Freshness(next_eligible=until) for scope, until in self.entries().items()}
        prefix = self._glob_prefix()
        patterns = ("{" + prefix + "*}fresh", "{*}fresh:" + prefix + "*")
        try:
            for raw in (
                key for pattern in patterns for key in self._client.scan_iter(match=pattern, count=1000)
            ):
                *fields, name = self._client.hmget(raw, ["s", "e", "t", "k"])
                scope = name.decode("utf-8", "replace") if isinstance(name, bytes) else name
                if not scope or self.companion(scope, "fresh") != _text(raw):
                    continue  # not a record of this store (another prefix that matched)
                found[scope] = _freshness(fields, found.get(scope, Freshness()).next_eligible)
        except Exception as exc:
            raise self._failure("freshness", exc) from exc
        return found

    def lease(self, scope: str, limit: int, ttl: float, now: datetime, token: str) -> datetime | None:
        """Take a concurrency slot (see ``MemoryCooldownStore.lease``): one ``EVALSHA``
        on the scope's "lease" key."""
        key = self.companion(check_scope(scope), "lease")
        now_ms = now_epoch_ms(check_until(now))
        ttl_ms = max(1, math.ceil(ttl * 1000))
        return self._admission("lease", self._lease_script, key, [now_ms, ttl_ms, limit, token])

    def _admission(self, operation: str, script: Any, key: str, args: list[object]) -> datetime | None:
        """Run a permit or slot script: -1 is "granted" (None), else an epoch-ms time."""
        try:
            reply = script(keys=[key], args=[str(arg) for arg in args])
        except Exception as exc:
            raise self._failure(operation, exc) from exc
        try:
            value = int(reply)
        except (TypeError, ValueError):
            raise CooldownStoreError(f"the Redis {operation} script returned an unexpected reply") from None
        return None if value < 0 else from_epoch_ms(value)

    def release(self, scope: str, token: str) -> None:
        """Give a concurrency slot back (one ``ZREM``)."""
        key = self.companion(check_scope(scope), "lease")
        try:
            self._client.zrem(key, token)
        except Exception as exc:
            raise self._failure("release", exc) from exc

    def delete(self, scope: str) -> bool:
        """Lift everything that holds ``scope`` back (an operator clearing it): its
        cooldown, announced allowance, every quota's permits and its concurrency leases
        (one ``DEL`` per key: they may live in two cluster slots); True if there was
        any of them."""
        key = self.key(check_scope(scope))
        tag, _ = _slot_string(key)
        if tag == key:  # {key}quota:L/P
            quotas = _glob(self.companion(scope, "quota:")) + "*"
        else:  # {tag}quota:L/P:key
            quotas = "{" + _glob(tag) + "}quota:*:" + _glob(key)
        try:
            keys = [key, self.companion(scope, "allowance"), self.companion(scope, "lease")]
            keys += [_text(found) for found in self._client.scan_iter(match=quotas, count=1000)]
            return sum(int(self._client.delete(name)) for name in keys) > 0
        except Exception as exc:
            raise self._failure("delete", exc) from exc

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
                    found.setdefault(scope, []).append(hold)
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
        client = self._client
        if name == "allowance":
            fields = client.hmget(key, ["r", "a", "u", "n", "l", "w", "x"])
            if fields[3] is None:
                return None
            left, at, until, count, lim, window = (int(float(_text(v or 0))) for v in fields[:6])
            record = Allowance(left, at, from_epoch_ms(until), count, lim, window / 1000, fields[6] == b"1")
            rolled = roll(record, now)
            return Hold("allowance", rolled.until) if rolled.until > now and rolled.remaining <= 0 else None
        if name == "lease":
            live = client.zrangebyscore(key, f"({now_ms}", "+inf", withscores=True)
            return Hold("leases", from_epoch_ms(int(live[-1][1])), len(live)) if live else None
        if name.startswith("quota:"):
            limit = int(name[len("quota:") :].split("/", 1)[0])
            live = client.zrangebyscore(key, f"({now_ms}", "+inf", withscores=True)
            if len(live) >= limit:
                return Hold("quota", from_epoch_ms(int(live[len(live) - limit][1])), limit)
        return None

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

    def close(self) -> None:
        """Close the client's connections (a client passed in is the caller's to close)."""
        if self._url_args is not None:
            try:
                self._client.close()
            except Exception as exc:
                raise self._failure("close", exc) from exc

    def __reduce__(self) -> tuple[Any, ...]:
        # A client (sockets, locks) cannot be pickled; a store made from a URL can be
        # rebuilt from it in another process.
        if self._url_args is None:
            raise TypeError(
                "a RedisCooldownStore built on a client cannot be pickled: build one in each "
                "process, or use RedisCooldownStore.from_url() / store_from_url()"
            )
        url, kwargs = self._url_args
        return (_restore, (url, self._prefix, kwargs))

    def __repr__(self) -> str:
        return f"RedisCooldownStore({type(self._client).__name__}, prefix={self._prefix!r})"

    def _failure(self, operation: str, exc: BaseException) -> CooldownStoreError:
        detail = _scrub(str(exc), self._secrets)
        return CooldownStoreError(
            f"the Redis cooldown store failed during {operation}: {type(exc).__name__}"
            + (f": {detail}" if detail else "")
        )


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _freshness(fields: list[Any], until: datetime | None) -> Freshness:
    """A freshness hash's (s, e, t) fields as a Freshness."""

    def when(raw: Any) -> datetime | None:
        try:
            return None if raw is None else from_epoch_ms(int(raw))
        except (TypeError, ValueError):
            return None

    success, error, error_at = fields
    text = error.decode("ascii", "replace") if isinstance(error, bytes) else error
    return Freshness(when(success), None if text is None else str(text), when(error_at), until)


def _slot_string(key: str) -> tuple[str, bool]:
    """What Redis Cluster hashes of ``key`` (its hash tag, else the whole key), with a
    tag free of braces for the scope's other keys, and whether ``{tag}...`` keys share
    the cooldown key's slot (False only for a key whose ``}`` is not part of a tag)."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end], True
    if "}" in key:
        return key.replace("}", ""), False
    return key, True


def _as_redis_url(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    mapped = {"valkey": "redis", "valkeys": "rediss"}.get(scheme.lower())
    return f"{mapped}{sep}{rest}" if mapped and sep else url


def redact_url(url: str) -> str:
    """``url`` for a message: no credentials (everything up to the last ``@``, so a
    password holding ``@``, ``/`` or ``?`` is cut whole), no query, no fragment."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    if "@" in rest:
        rest = "***@" + rest.rpartition("@")[2]
    rest = rest.split("?", 1)[0].split("#", 1)[0]
    return (scheme + sep + rest)[:200]


def _url_secrets(url: str) -> list[str]:
    """The userinfo of ``url`` and its password part, to keep out of messages."""
    userinfo = url.partition("://")[2].rpartition("@")[0]
    return [part for part in (userinfo, userinfo.partition(":")[2]) if part]


def _client_timeout(client: Any) -> float | None:
    """Connect plus socket timeout of a redis-py style client's pool, if both are set."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if not isinstance(kwargs, dict):
        return None
    reply = kwargs.get("socket_timeout")
    connect = kwargs.get("socket_connect_timeout", reply)
    if connect is None:
        connect = reply
    total = 0.0
    for value in (reply, connect):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            return None
        total += float(value)
    return total


def _client_secrets(client: Any) -> list[str]:
    """Credentials configured on a redis-py style client, to keep out of messages."""
    found: set[str] = set()
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if isinstance(kwargs, dict):
        value = kwargs.get("password")
        if isinstance(value, str) and value:
            found.add(value)
    return sorted(found, key=len, reverse=True)


def _scrub(text: str, secrets: list[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        if secret:
            text = text.replace(secret, "***")
    return _USERINFO.sub("***@", text)[:300]
