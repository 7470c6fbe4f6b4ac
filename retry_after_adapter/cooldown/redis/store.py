"""A cooldown store in Redis or Valkey, shared by processes on every machine.

One key per scope (``prefix + scope``) holds the eligible time as UTC epoch
milliseconds. The later-wins extend is a server-side Lua script: one round trip, atomic,
touching a single key (so it works on a cluster without cross-slot operations). Each
key expires a minute after its cooldown ends, so expired cooldowns clean themselves up.

``redis`` (redis-py) is an optional dependency: this module never imports it at import
time; only :meth:`RedisCooldownStore.from_url` does, when called.
"""

from __future__ import annotations

import functools
import inspect
import math
import secrets
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from ...errors import ConfigurationError, CooldownStoreError, failure_cause
from ...redact import client_secrets, redact_url, scrub, url_secrets
from .._ms import from_epoch_ms, now_epoch_ms, to_epoch_ms, window_ms
from ..allowance import ALLOWANCE_KEPT, SAME_WINDOW, Allowance, roll
from ..base import (
    TOKENS,
    Admission,
    Ask,
    Bounded,
    Changed,
    Feed,
    Forgetful,
    Hold,
    LeaseRenewal,
    PartwiseStore,
    Reservations,
    Weighed,
    Weights,
    check_scope,
    check_until,
    quiesce_guard,
    token_scope,
)
from ..freshness import FRESHNESS_KEPT, Freshness, check_outcome
from ..rate import RATE_KEPT, Rate, rate_holds
from ..weights import check_fits
from .feed import CHANNEL, RedisFeed
from .wire import (
    OPEN_SUFFIX,
    RATE_FIELDS,
    RATE_KEY,
    SCRIPTS,
    TOKENS_KEY,
    WAIT_SUFFIX,
    admission_of,
    admit_args,
    as_redis_url,
    client_timeout,
    database_of,
    freshness_of,
    glob_pattern,
    learned_rate_of,
    script_source,
    slot_string,
    text_of,
)

# ------------------------------------------------------------------------------------
# The operator's view of :class:`RedisCooldownStore` (the ``Listing``
# capability): what is stored, what holds each scope back, and lifting it. A mixin of
# the store; SCAN throughout, so that the server is never blocked.


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
        tag, _ = slot_string(key)
        if tag == key:  # {key}quota:L/P, {key}tokens:L/P
            quotas = glob_pattern(self.companion(scope, "quota:")) + "*"
            tokens = glob_pattern(self.companion(scope, "tokens:")) + "*"
        else:  # {tag}quota:L/P:key, {tag}tokens:L/P:key
            quotas = "{" + glob_pattern(tag) + "}quota:*:" + glob_pattern(key)
            tokens = "{" + glob_pattern(tag) + "}tokens:*:" + glob_pattern(key)
        try:
            keys = [key, self.companion(scope, "allowance"), self.companion(scope, "lease")]
            keys += [self.companion(scope, TOKENS_KEY), self.companion(scope, RATE_KEY)]
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
        found = (text_of(raw) for raw in self._client.scan_iter(match=pattern, count=1000))
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
                named = self._companion_of(text_of(raw))
                if named is None:
                    continue
                scope, name = named
                hold = self._hold(text_of(raw), name, now, now_ms)
                if hold is not None:
                    # The announced token allowance under its own scope, as the other stores keep it.
                    found.setdefault(token_scope(scope) if name == TOKENS_KEY else scope, []).append(hold)
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
        if name in ("allowance", TOKENS_KEY):
            return self._allowance_hold(key, now)
        if name == "lease":
            live = self._client.zrangebyscore(key, f"({now_ms}", "+inf", withscores=True)
            return Hold("leases", from_epoch_ms(int(live[-1][1])), len(live)) if live else None
        if name == RATE_KEY:
            return self._rate_hold(key, now_ms)
        if name.startswith("tokens:"):
            limit = int(name[len("tokens:") :].split("/", 1)[0])
            live = self._client.zrangebyscore(key, f"({now_ms}", "+inf", withscores=True)
            weight = sum(int(text_of(member).rsplit(":", 1)[1]) for member, _ in live)
            return Hold("tokens", from_epoch_ms(int(live[0][1])), limit) if weight >= limit else None
        if name.startswith("quota:") and not name.endswith((OPEN_SUFFIX, WAIT_SUFFIX)):
            limit = int(name[len("quota:") :].split("/", 1)[0])
            live = self._client.zrangebyscore(key, f"({now_ms}", "+inf", withscores=True)
            if len(live) >= limit:
                return Hold("quota", from_epoch_ms(int(live[len(live) - limit][1])), limit)
        return None

    def _allowance_hold(self, key: str, now: datetime) -> Hold | None:
        fields = self._client.hmget(key, ["r", "a", "u", "n", "l", "w", "x"])
        if fields[3] is None:
            return None
        left, at, until, count, lim, window = (int(float(text_of(v or 0))) for v in fields[:6])
        record = Allowance(left, at, from_epoch_ms(until), count, lim, window / 1000, fields[6] == b"1")
        rolled = roll(record, now)
        return Hold("allowance", rolled.until) if rolled.until > now and rolled.remaining <= 0 else None

    def _rate_hold(self, key: str, now_ms: int) -> Hold | None:
        rate = learned_rate_of(self._client.hmget(key, list(RATE_FIELDS)))
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
        return glob_pattern(self._prefix)



#: The default connect and reply timeouts (seconds) of a client made by ``from_url``.
DEFAULT_SOCKET_TIMEOUT = 0.1

#: How long (ms) a key outlives its cooldown before Redis deletes it.
GRACE_MS = 60_000


#: Milliseconds a freshness record is kept after its last note (30 days).
FRESHNESS_KEPT_MS = int(FRESHNESS_KEPT * 1000)

_INSTALL_HINT = "pip install 'retry_after_adapter[redis]' (from a checkout: pip install -e '.[redis]')"



def _unknown_options(client: Any) -> list[str]:
    """The keyword arguments a client's connections were given that its connection
    class takes under no name (redis-py keeps them until it connects, and then fails
    with a TypeError a store would report as an outage); [] when that cannot be told."""
    try:
        pool = client.connection_pool
        given = set(pool.connection_kwargs)
        known: set[str] = set()
        closed = False  # a class of the chain that takes no **kwargs: the names are all
        for klass in pool.connection_class.__mro__:
            init = klass.__dict__.get("__init__")
            if init is None or klass is object:
                continue
            params = inspect.signature(init).parameters.values()
            known.update(p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL))
            closed = closed or not any(p.kind is p.VAR_KEYWORD for p in params)
    except Exception:  # another client's shape: left to redis-py
        return []
    return sorted(given - known) if closed else []


def _present(now: datetime | None) -> datetime:
    """``now`` checked, or this host's present."""
    return datetime.now(timezone.utc) if now is None else check_until(now)


def _restore(url: str, prefix: str, client_kwargs: dict[str, Any]) -> RedisCooldownStore:
    return RedisCooldownStore.from_url(url, prefix=prefix, **client_kwargs)


class RedisCooldownStore(
    RedisListing, PartwiseStore, Weights, Bounded, Forgetful, LeaseRenewal, Reservations
):
    """Cooldowns shared by every process on every machine through Redis or Valkey.

    ``client`` is any synchronous redis-py compatible client: ``redis.Redis``,
    ``redis.RedisCluster``, ``valkey.Valkey``... It should have short socket timeouts
    and few retries (see :meth:`from_url`), so a store outage costs a call a fraction
    of a second rather than hanging it. ``prefix`` is prepended to each scope to make
    its key. ``timeout`` (seconds) is how long one operation can take at most; by
    default it is read from a ``redis.Redis`` client's connect and socket timeouts. The
    store declares it (:class:`~.base.Bounded`: :meth:`operation_timeout`); a store
    without a known bound has each operation run on a helper thread of the failure
    layer, bounded there (a little slower).

    ``get`` is one ``GET``; ``extend`` is one ``EVALSHA`` (the script is loaded again by
    the client after a server restart). Times are whole UTC epoch milliseconds, rounded
    up, so machines agree and a cooldown never ends earlier than asked. Any error of
    the client (connection refused, timeout, authentication, a wrong key type...) is
    raised as :class:`CooldownStoreError`, whose message never contains the server's
    URL credentials.
    """

    #: ``rate_answer`` reads what kind of attempt was answered (``LearnedRate.rate_kinds``).
    rate_kinds = True

    def __init__(
        self, client: Any, *, prefix: str = "retry-after:", timeout: float | None = None, push: bool = True
    ) -> None:
        if not isinstance(prefix, str):
            raise ConfigurationError("the Redis cooldown key prefix must be a str")
        if not isinstance(push, bool):
            raise ConfigurationError("push must be True or False")
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
        self._timeout = float(timeout) if timeout is not None else client_timeout(client)
        self._secrets = client_secrets(client)
        try:  # registered locally: no round trip until a script first runs
            scripts = {name: client.register_script(script_source(name)) for name in SCRIPTS}
        except Exception as exc:
            raise self._failure("register_script", exc) from exc
        self._script = scripts["extend"]
        self._admit_script = scripts["admit"]
        self._allow_script = scripts["allow"]
        self._note_script = scripts["note"]
        self._settle_script = scripts["settle"]
        self._settle_weighed_script = scripts["settle_weighed"]
        self._rate_script = scripts["rate_answer"]
        self._renew_script = scripts["renew"]
        self._renew_open_script = scripts["renew_open"]
        self._url_args: tuple[str, dict[str, Any]] | None = None
        #: The pub/sub channel changes are published on: one per database and prefix
        #: (Redis's pub/sub is one for all its databases, so tenants on two databases of
        #: one server never hear each other's changes). Every store publishes there,
        #: ``push=False`` too: other processes' near copies trust the channel to carry
        #: every write (a writer heard by nobody would let them send inside its cooldowns).
        self._channel = f"{CHANNEL}{database_of(client)}:{prefix}"
        #: Whether this process follows the channel and keeps a near copy (see :meth:`feed`).
        self._push = push

    @classmethod
    def from_url(
        cls,
        url: str,
        *,
        prefix: str = "retry-after:",
        push: bool = True,
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
            client = redis.Redis.from_url(as_redis_url(url), **kwargs)
        except (ValueError, TypeError) as exc:
            raise ConfigurationError(
                f"invalid Redis cooldown URL {redact_url(url)!r}: {scrub(str(exc), url_secrets(url))}"
            ) from None
        unknown = _unknown_options(client)
        if unknown:
            hint = " (a timeout: socket_timeout= and socket_connect_timeout=)" if "timeout" in unknown else ""
            raise ConfigurationError(
                f"unknown Redis client option{'s' if len(unknown) > 1 else ''} {', '.join(unknown)} "
                f"(redis-py's connections take no such keyword){hint}"
            )
        store = cls(client, prefix=prefix, push=push)
        options = dict(
            client_kwargs, socket_timeout=socket_timeout, socket_connect_timeout=socket_connect_timeout
        )
        options["push"] = push
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

    def operation_timeout(self) -> float | None:
        """The most (seconds) one operation takes, as :attr:`timeout` (see
        :class:`~.base.Bounded`)."""
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
            effective = self._script(keys=[key], args=[str(ms), str(ms + GRACE_MS), self._channel, scope])
        except Exception as exc:
            raise self._failure("extend", exc) from exc
        try:
            return from_epoch_ms(int(effective))
        except (TypeError, ValueError):
            raise CooldownStoreError("the Redis cooldown script returned an unexpected reply") from None

    def companion(self, scope: str, name: str) -> str:
        """The key of ``scope``'s ``name`` record ("quota:<limit>/<per_ms>", "allowance",
        "allowance:tokens", "tokens:<limit>/<per_ms>", "lease", "fresh", "learned-rate";
        docs/store-format.md lists them): hash
        tagged so that it lives in the cluster slot of the scope's cooldown key (the
        cooldown key unchanged: ``{prefix + scope}name``, or for a key with a hash tag of
        its own ``{tag}name:`` and the key)."""
        key = self.key(scope)
        tag, _ = slot_string(key)
        if tag == key:
            return "{" + key + "}" + name
        # The key's own hash tag: the key follows, so that prefixes never share a key.
        return "{" + tag + "}" + name + ":" + key

    def quota_key(self, scope: str, limit: int, per: float, suffix: str = "") -> str:
        """The permit set of the quota ``limit`` per ``per`` seconds of ``scope`` (one
        per quota, so two quotas on one scope each hold; see :meth:`companion`), or
        with ``suffix`` ":open" its open permits."""
        return self.companion(scope, f"quota:{int(limit)}/{window_ms(per)}{suffix}")

    def token_key(self, scope: str, limit: int, per: float) -> str:
        """The token permits of the token quota ``limit`` per ``per`` seconds of
        ``scope`` (see :meth:`companion`)."""
        return self.companion(scope, f"tokens:{int(limit)}/{window_ms(per)}")

    def admit(self, ask: Ask) -> Admission:
        """Admission for one attempt (see ``MemoryCooldownStore.admit``): the cooldown,
        the announced allowance, the quota permit (and ``batch`` extra ones, see
        ``Store.admit``) and the concurrency slot in one
        ``EVALSHA``, all or nothing, the keys in one cluster slot; ``now`` None: this
        host's clock read right before the script (the clock every cooldown of the store
        is stamped with; Redis's own would mix two clocks). A late answer moves the
        permit later (:meth:`settle`). (A scope whose key has a ``}`` that Redis would
        not read as a hash tag has its cooldown read by a ``GET`` before: two round
        trips.)"""
        scope, now, limit, per, learn, weigh = ask.scope, ask.now, ask.limit, ask.per, ask.learn, ask.weigh
        key = self.key(check_scope(scope))
        _, together = slot_string(key)
        stored = None if together else self.get(scope)
        when = _present(now)
        if stored is not None and stored > when:
            return Admission(cooldown=stored, not_before=stored)
        quota = limit is not None and per is not None
        allowance = self.companion(scope, "allowance")
        permits = self.quota_key(scope, limit, per) if quota else allowance  # type: ignore[arg-type]
        opens = self.quota_key(scope, limit, per, OPEN_SUFFIX) if quota else allowance  # type: ignore[arg-type]
        keys = [key if together else allowance, permits, allowance, self.companion(scope, "lease")]
        keys += [self.companion(scope, RATE_KEY), opens, self.companion(scope, TOKENS_KEY)]
        weighs = weigh is not None and weigh.limit > 0
        if weighs:
            check_fits(weigh.cost, weigh.limit, weigh.per)  # type: ignore[union-attr]
        keys += [self.token_key(scope, weigh.limit, weigh.per) if weighs else allowance]  # type: ignore[union-attr]
        keys += [self.quota_key(scope, limit, per, WAIT_SUFFIX) if quota else allowance]  # type: ignore[arg-type]
        try:
            reply = self._admit_script(keys=keys, args=admit_args(ask, when, together))
        except Exception as exc:
            raise self._failure("admit", exc) from exc
        return admission_of(reply, None if together else stored, together, learn)

    def rate_answer(
        self, scope: str, epoch: int | None, until: datetime | None, now: datetime, probe: bool | None = None
    ) -> None:
        """See ``Store.rate_answer``: one ``EVALSHA`` on the scope's "rate" key."""
        key = self.companion(check_scope(scope), RATE_KEY)
        args = [
            -1 if epoch is None else int(epoch),
            -1 if until is None else to_epoch_ms(check_until(until)),
            now_epoch_ms(check_until(now)),
            int(RATE_KEPT * 1000),
            self._channel,
            scope,
            "" if probe is None else int(probe),
        ]
        try:
            self._rate_script(keys=[key], args=[str(arg) for arg in args])
        except Exception as exc:
            raise self._failure("rate_answer", exc) from exc

    def rate_of(self, scope: str) -> Rate | None:
        """See ``Store.rate_of``: one ``HMGET``."""
        key = self.companion(check_scope(scope), RATE_KEY)
        try:
            raw = self._client.hmget(key, list(RATE_FIELDS))
        except Exception as exc:
            raise self._failure("rate_of", exc) from exc
        return learned_rate_of(raw)

    def settle(
        self, scope: str, limit: int, per: float, expires: datetime, now: datetime | None = None,
        exact: bool = False,
    ) -> None:
        """The attempt whose permit stops counting at ``expires`` was answered at ``now``
        (None: this host's present): the permit counts at least until ``now + per`` (see
        ``MemoryCooldownStore.settle``; ``exact``: until then exactly). One ``EVALSHA``."""
        keys, args = self._settle_call(scope, limit, per, expires, now, exact)
        try:
            self._settle_script(keys=keys, args=args)
        except Exception as exc:
            raise self._failure("settle", exc) from exc

    def settle_many(self, settles: Sequence[tuple[Any, ...]]) -> None:
        """Several settles (each :meth:`settle`'s arguments) in one round trip: one
        ``EVALSHA`` of ``settle.lua`` per quota key, carrying all of that key's settles
        in order, pipelined (not a transaction: each is one script already; on a
        cluster, one round trip per node)."""
        calls: dict[tuple[str, ...], list[str]] = {}
        for settle in settles:
            keys, call = self._settle_call(*settle)
            calls.setdefault(tuple(keys), call[:1]).extend(call[1:])  # a key names its per
        script = self._settle_script
        groups = [(list(keys), args) for keys, args in calls.items()]
        try:
            pipe = self._client.pipeline(transaction=False)
            for keys, args in groups:  # EVALSHA itself: a Script on a pipeline asks first
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            results = pipe.execute(raise_on_error=False)
            failed = [
                group for group, result in zip(groups, results, strict=True) if isinstance(result, Exception)
            ]
            for result in results:
                if isinstance(result, Exception) and type(result).__name__ != "NoScriptError":
                    raise result
            if failed:  # a server without the script (new, or restarted): loaded, then the rest
                script(keys=failed[0][0], args=failed[0][1])
                pipe = self._client.pipeline(transaction=False)
                for keys, args in failed[1:]:
                    pipe.evalsha(script.sha, len(keys), *keys, *args)
                pipe.execute()
        except Exception as exc:
            raise self._failure("settle_many", exc) from exc

    def _settle_call(
        self, scope: str, limit: int, per: float, expires: datetime, now: datetime | None = None,
        exact: bool = False,
    ) -> tuple[list[str], list[str]]:
        """A settle's keys and arguments for ``settle.lua`` (per, then the settle's four)."""
        key = self.quota_key(check_scope(scope), limit, per)
        args = [
            str(window_ms(per)),
            str(to_epoch_ms(_present(now))),  # rounded up: the request reached the server before
            str(to_epoch_ms(check_until(expires))),
            secrets.token_hex(8),
            "1" if exact else "0",
        ]
        waiting = self.quota_key(scope, limit, per, WAIT_SUFFIX)
        return [key, self.quota_key(scope, limit, per, OPEN_SUFFIX), waiting], args

    def allow(
        self, scope: str, remaining: int, until: datetime, now: datetime, seq: int | None = None,
        limit: int | None = None, window: float | None = None,
    ) -> None:
        """Record the server's announced allowance (see ``MemoryCooldownStore.allow``):
        one ``EVALSHA`` on the scope's "allowance" key (for a ``token_scope``, the
        token allowance beside the scope's own)."""
        check_scope(scope)
        if scope.endswith(TOKENS) and len(scope) > len(TOKENS):
            key = self.companion(scope[: -len(TOKENS)], TOKENS_KEY)
        else:
            key = self.companion(scope, "allowance")
        args = [
            int(remaining),
            to_epoch_ms(check_until(until)),
            now_epoch_ms(check_until(now)),
            -1 if seq is None else int(seq),
            int(limit) if limit else 0,
            round(window * 1000) if window else 0,
            int(SAME_WINDOW * 1000),
            int(ALLOWANCE_KEPT * 1000),
            self._channel,
            scope,
        ]
        try:
            self._allow_script(keys=[key], args=[str(arg) for arg in args])
        except Exception as exc:
            raise self._failure("allow", exc) from exc

    def settle_weighed(self, scope: str, weighed: Weighed, now: datetime | None = None) -> None:
        """See ``Weights.settle_weighed``: one ``EVALSHA`` on the token quota's key (the
        answer's time rounded up: the request reached the server before it)."""
        key = self.token_key(check_scope(scope), weighed.limit, weighed.per)
        args = [
            to_epoch_ms(_present(now)),
            window_ms(weighed.per),
            to_epoch_ms(check_until(weighed.expires)),
            int(weighed.cost),
            secrets.token_hex(8),
        ]
        try:
            self._settle_weighed_script(keys=[key], args=[str(arg) for arg in args])
        except Exception as exc:
            raise self._failure("settle_weighed", exc) from exc

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
        return freshness_of(fields, until)

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
                if not scope or self.companion(scope, "fresh") != text_of(raw):
                    continue  # not a record of this store (another prefix that matched)
                found[scope] = freshness_of(fields, found.get(scope, Freshness()).next_eligible)
        except Exception as exc:
            raise self._failure("freshness", exc) from exc
        return found

    def release(self, scope: str, token: str) -> None:
        """Give a concurrency slot back (one ``ZREM``)."""
        key = self.companion(check_scope(scope), "lease")
        try:
            self._client.zrem(key, token)
        except Exception as exc:
            raise self._failure("release", exc) from exc

    def lifted(self, scope: str) -> bool:
        """Whether ``delete`` lifted ``scope`` while a cooldown it held may still be
        running (its "lifted" mark, see :meth:`delete`): one ``EXISTS``. A Redis
        restarted without persistence comes back without the mark, so a cooldown
        missing from it then reads as lost (see ``base.Forgetful``)."""
        key = self.companion(check_scope(scope), "lifted")
        try:
            return bool(self._client.exists(key))
        except Exception as exc:
            raise self._failure("lifted", exc) from exc

    def renew(
        self, leases: Sequence[tuple[str, str, datetime]], now: datetime | None = None, exact: bool = False
    ) -> set[str]:
        """Move held leases later, or (``exact``) to the end given (see
        ``LeaseRenewal.renew``): one ``EVALSHA`` of ``renew.lua`` per scope, pipelined
        (on a cluster, one round trip per node)."""
        at = str(now_epoch_ms(now if now is not None else datetime.now(timezone.utc)))
        calls: dict[str, list[str]] = {}
        flag = "1" if exact else "0"
        for scope, token, until in leases:
            key = self.companion(check_scope(scope), "lease")
            calls.setdefault(key, [at, flag]).extend((token, str(to_epoch_ms(check_until(until)))))
        replies = self._pipelined(self._renew_script, calls, "renew")
        return {text_of(token) for reply in replies.values() for token in reply}

    def renew_open(
        self, permits: Sequence[tuple[str, int, float, datetime, datetime, int]], now: datetime | None = None
    ) -> list[int]:
        """Move open permits' ends later (see ``LeaseRenewal.renew_open``): one
        ``EVALSHA`` of ``renew_open.lua`` per quota, pipelined."""
        at = str(now_epoch_ms(now if now is not None else datetime.now(timezone.utc)))
        calls: dict[tuple[str, str], list[str]] = {}
        order: list[tuple[tuple[str, str], int]] = []
        for scope, limit, per, end, until, count in permits:
            key = self.quota_key(check_scope(scope), limit, per)
            keys = (key, self.quota_key(scope, limit, per, OPEN_SUFFIX))
            args = calls.setdefault(keys, [at])
            order.append((keys, (len(args) - 1) // 3))
            ends = (to_epoch_ms(check_until(end)), to_epoch_ms(check_until(until)))
            args.extend((str(ends[0]), str(ends[1]), str(count)))
        replies = self._pipelined(self._renew_open_script, dict(calls), "renew_open")
        return [int(replies[keys][index]) for keys, index in order]

    def _pipelined(self, script: Any, calls: dict[Any, list[str]], name: str) -> dict[Any, Any]:
        """``script`` run once per entry of ``calls`` (its keys: a key or a tuple of
        keys; its arguments), pipelined: each entry's reply. On a server without the
        script (new, or restarted), the first entry that failed loads it as it runs,
        then the others that failed run (each entry runs once)."""
        items = [([keys] if isinstance(keys, str) else list(keys), args) for keys, args in calls.items()]
        try:
            pipe = self._client.pipeline(transaction=False)
            for keys, args in items:  # EVALSHA itself: a Script on a pipeline asks first
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            results = list(pipe.execute(raise_on_error=False))
            for result in results:
                if isinstance(result, Exception) and type(result).__name__ != "NoScriptError":
                    raise result
            failed = [index for index, result in enumerate(results) if isinstance(result, Exception)]
            if failed:
                keys, args = items[failed[0]]
                results[failed[0]] = script(keys=keys, args=args)
                if failed[1:]:
                    pipe = self._client.pipeline(transaction=False)
                    for index in failed[1:]:
                        keys, args = items[index]
                        pipe.evalsha(script.sha, len(keys), *keys, *args)
                    for index, result in zip(failed[1:], pipe.execute(), strict=True):
                        results[index] = result
        except Exception as exc:
            raise self._failure(name, exc) from exc
        return dict(zip(calls, results, strict=True))

    def feed(self, changed: Changed) -> Feed | None:
        """The store's change channel, followed by a thread of this process (see
        ``RedisFeed``); None when the store was made with ``push=False`` (this process
        then follows nothing; what it writes is still published for the others)."""
        if not self._push:
            return None
        # The feed names its failures as the store does, without holding the store (its
        # failure layer holds the store weakly: both are collected once it is unused).
        return RedisFeed(self._client, self._channel, changed, functools.partial(_failure, self._secrets))

    def close(self) -> None:
        """Close the client's connections (a client passed in is the caller's to close),
        what waits to be written first (see ``base.quiesce_guard``)."""
        quiesce_guard(self)
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
        """``exc`` as the package's error (see :func:`_failure`)."""
        return _failure(self._secrets, operation, exc)


def _failure(hidden: Any, operation: str, exc: BaseException) -> CooldownStoreError:
    """``exc`` as the package's error: what it was (``failure_cause``: an
    authentication, a permission or TLS that will not heal told apart from a timeout or
    a refused connection), without the URL's credentials (``hidden``)."""
    detail = scrub(str(exc), hidden)
    cause, lasting = failure_cause(exc)
    return CooldownStoreError(
        f"the Redis cooldown store failed during {operation}: {cause} ({type(exc).__name__}"
        + (f": {detail}" if detail else "")
        + ")",
        cause=cause,
        lasting=lasting,
    )
