"""What travels between :class:`~.redis.RedisCooldownStore` and the server: the Lua
scripts' sources (files of the ``lua`` folder), their arguments and replies, and what
is read of a URL or a client. Times here are UTC epoch milliseconds."""

from __future__ import annotations

import math
import re
import secrets
from datetime import datetime
from importlib import resources
from typing import Any

from ...errors import CooldownStoreError
from .._ms import from_epoch_ms, now_epoch_ms, to_epoch_ms, window_ms
from ..allowance import ALLOWANCE_KEPT
from ..base import Admission, Ask, Learn, Lease
from ..freshness import Freshness
from ..rate import RATE_KEPT, Rate, rate_from_row

#: Companion key names (see ``RedisCooldownStore.companion``): the learned rate's
#: hash (and its fields), a quota's open permits, a scope's announced token allowance.
RATE_KEY = "learned-rate"
RATE_FIELDS = ("cap", "lim", "win", "ep", "st", "base", "sn", "ok", "gr", "gc", "qt", "pr", "fl")
OPEN_SUFFIX = ":open"
#: The suffix of a quota's reservations not yet used (``base.Reservations``).
WAIT_SUFFIX = ":wait"
TOKENS_KEY = "allowance:tokens"


def lua(*names: str) -> str:
    """The Lua scripts ``names`` (files of the package's ``lua`` folder), joined in
    that order: a library such as ``allowance`` comes before the script that uses it."""
    folder = resources.files(__package__).joinpath("lua")
    return "\n".join(folder.joinpath(f"{name}.lua").read_text("utf-8") for name in names)


#: Each script's files, in load order.
SCRIPTS = {
    "extend": ("extend",),
    "admit": ("allowance", "rate", "admit"),
    "rate_answer": ("rate", "rate_answer"),
    "allow": ("allowance", "allow"),
    "settle": ("settle",),
    "settle_weighed": ("settle_weighed",),
    "note": ("note",),
    "renew": ("renew",),
    "renew_open": ("renew_open",),
}


_SOURCES: dict[str, str] = {}


def script_source(name: str) -> str:
    """The source of the script ``name`` (read once per process)."""
    source = _SOURCES.get(name)
    if source is None:
        source = _SOURCES[name] = lua(*SCRIPTS[name])
    return source


_GLOB_SPECIAL = re.compile(r"[*?\[\]\\]")


def _counts_ms(per: float, margin: float) -> int:
    """How long (ms) a permit of a quota of ``per`` seconds counts: ``per + margin``."""
    return window_ms(per) + math.ceil(margin * 1000)


def glob_pattern(text: str) -> str:
    """``text`` as a SCAN pattern that matches it literally."""
    return _GLOB_SPECIAL.sub(r"\\\g<0>", text)


def _ms_or_none(ms: int) -> datetime | None:
    """A script's time: None for -1 (none)."""
    return None if ms < 0 else from_epoch_ms(ms)


def admission_of(reply: Any, stored: datetime | None, together: bool, learn: Learn | None) -> Admission:
    """The admit script's reply as an :class:`Admission`: eight numbers (see
    ``admit.lua``), three more when the learned rate admitted, two (-3 and the limit)
    when a cost is above the announced token limit; ``stored``: the cooldown
    read before the script when it could not read it (``together`` False)."""
    try:
        cooldown, wait, seq, busy, permit, extra, units, reset = (int(value) for value in reply[:8])
        rated = [int(value) for value in reply[8:11]]
    except (TypeError, ValueError):
        raise CooldownStoreError("the Redis admit script returned an unexpected reply") from None
    known = _ms_or_none(cooldown) if together else stored
    end = from_epoch_ms(permit) if permit >= 0 else None
    number = None if seq < 0 else seq
    until = from_epoch_ms(reset) if units > 0 else None
    if len(reply) > 11:  # a grant that weighed tokens (its rated part is -2)
        return Admission(
            cooldown=known, not_before=None, seq=number, permit=end, extra=extra, units=units,
            units_until=until, weighed=_ms_or_none(int(reply[11])),
            token_seq=rated[1] if rated[1] >= 0 else None,
        )
    if rated[:1] == [-4]:  # a reservation (base.Reservations): the permit counts from then
        return Admission(cooldown=known, not_before=None, permit=end, reserved=from_epoch_ms(rated[1]))
    if rated[:1] == [-3]:  # a cost above the announced token limit (weights.oversized)
        return Admission(cooldown=known, not_before=from_epoch_ms(wait), oversized=rated[1])
    if rated:
        return _rate_admission(rated, known, wait, busy, end, learn)
    if wait < 0 and (permit >= 0 or units > 0):
        return Admission(
            cooldown=known, not_before=None, seq=number, permit=end, extra=extra, units=units,
            units_until=until,
        )
    return Admission(cooldown=known, not_before=_ms_or_none(wait), slot_busy=bool(busy), seq=number)


def _rate_admission(
    rated: list[int], known: datetime | None, wait: int, busy: int, end: datetime | None,
    learn: Learn | None,
) -> Admission:
    """The admit script's reply when the learned rate decided (``rated``: its numbers
    after the eighth): held back until ``wait`` (ms; ``busy``: every slot of its cap
    held), or, ``wait`` -1, admitted; ``rated`` is then the rate's epoch, 1 when a
    probe's good answer is to be told, 1 when the slot was taken as the probe's token
    (``learn``'s)."""
    if wait >= 0:
        return Admission(cooldown=known, not_before=from_epoch_ms(wait), slot_busy=bool(busy), by_rate=True)
    assert learn is not None
    token = learn.token if rated[2] else None
    return Admission(
        cooldown=known, not_before=None, permit=end, token=token, rate_epoch=rated[0],
        rate_report=bool(rated[1]),
    )


def _permit_args(limit: int | None, per: float | None, margin: float, when: datetime) -> tuple[object, ...]:
    """The admit script's quota arguments: how long a permit counts (ms, 0: no quota)
    from ``when`` as passed (rounded down), the limit and a unique member. When ``when``
    has a part of a millisecond, a permit counts one millisecond more: its end is
    ``when`` rounded *up* + per + margin, never before its grant's."""
    if limit is None or per is None:
        return (0, 0, "")
    carry = to_epoch_ms(when) - now_epoch_ms(when)
    return (_counts_ms(per, margin) + carry, limit, secrets.token_hex(8))


def _lease_args(lease: Lease | None) -> tuple[object, ...]:
    """The admit script's lease arguments: the slots (0: no cap), ttl (ms), token."""
    if lease is None:
        return (0, 0, "")
    return (lease.slots, window_ms(lease.ttl), lease.token)


def admit_args(ask: Ask, when: datetime, together: bool) -> list[str]:
    """The admit script's arguments for ``ask`` at ``when`` (an aware UTC datetime: the
    present, passed as whole ms rounded down), in ``admit.lua``'s order: the quota's
    (see :func:`_permit_args`), whether the script reads the cooldown (``together``),
    how long an allowance is kept, the lease's, the batch and its hold, the learned
    rate's, how much longer an open permit counts and the quota's per (ms; 0 without a
    quota), then the attempt's tokens (``weigh``: its cost, the token quota's limit,
    how long its permit counts in ms and a unique member; zeros without)."""
    limit, per, learn, opened, weigh = ask.limit, ask.per, ask.learn, ask.opened, ask.weigh
    args = [now_epoch_ms(when), *_permit_args(limit, per, ask.margin + opened, when)]
    args += ["1" if together else "0"]
    args += [int(ALLOWANCE_KEPT * 1000), *_lease_args(ask.lease), int(ask.batch), round(ask.hold * 1000)]
    if learn is not None:
        args += ["1", window_ms(learn.ttl), learn.token, int(RATE_KEPT * 1000)]
    else:
        args += ["0", 0, "", 0]
    if limit is not None and per is not None:
        args += [math.ceil(opened * 1000), window_ms(per)]
    else:
        args += [0, 0]
    if weigh is not None:
        # A token permit counts per + margin from ``when`` rounded up (see _permit_args).
        counts = _counts_ms(weigh.per, weigh.margin) + to_epoch_ms(when) - now_epoch_ms(when)
        args += [weigh.cost, weigh.limit, counts, secrets.token_hex(8)]
    else:
        args += [0, 0, 0, ""]
    args += [-1 if ask.reserve_by is None else now_epoch_ms(ask.reserve_by)]  # (rounded down)
    args += [-1 if ask.held is None else to_epoch_ms(ask.held), int(ask.priority)]
    return [str(arg) for arg in args]


def text_of(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def learned_rate_of(fields: list[Any]) -> Rate | None:
    """A learned-rate hash's fields (``rate.Rate``'s, in ``rate.rate_row``'s order; times
    in ms) as a Rate, or None when the hash holds none."""
    if fields[0] is None:
        return None
    return rate_from_row(tuple(int(float(text_of(v or b"0"))) for v in fields))


def freshness_of(fields: list[Any], until: datetime | None) -> Freshness:
    """A freshness hash's (s, e, t) fields as a Freshness."""

    def when(raw: Any) -> datetime | None:
        try:
            return None if raw is None else from_epoch_ms(int(raw))
        except (TypeError, ValueError):
            return None

    success, error, error_at = fields
    text = error.decode("ascii", "replace") if isinstance(error, bytes) else error
    return Freshness(when(success), None if text is None else str(text), when(error_at), until)


def slot_string(key: str) -> tuple[str, bool]:
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


def as_redis_url(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    mapped = {"valkey": "redis", "valkeys": "rediss"}.get(scheme.lower())
    return f"{mapped}{sep}{rest}" if mapped and sep else url


def database_of(client: Any) -> int:
    """The database a redis-py style client uses (a cluster has one: 0)."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    database = kwargs.get("db", 0) if isinstance(kwargs, dict) else 0
    try:
        return int(database or 0)
    except (TypeError, ValueError):
        return 0


def client_timeout(client: Any) -> float | None:
    """Connect plus socket timeout of a redis-py style client's pool (a cluster client's:
    the ones its nodes' connections get), if both are set."""
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    if kwargs is None:  # redis.cluster.RedisCluster: no pool of its own
        kwargs = getattr(getattr(client, "nodes_manager", None), "connection_kwargs", None)
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
