"""Connections idle past the server's announced keep-alive timeout are not reused.

A server may close a kept-alive connection once it has been idle for a while, and a
client that sends on it at that moment loses the request (``RemoteDisconnected`` or a
reset): it never reached the server, yet it was admitted, and it is sent again. Many
servers say how long they keep an idle connection (``Keep-Alive: timeout=5``, as
Node's http server and Apache send); urllib3 does not read it. The adapter and
:class:`~retry_after_adapter.RetryAfterPoolManager` do (:func:`note`, after each
attempt): once a server announces it, its pool reads it from every answer, and a
connection whose last answer announced ``timeout=N`` and that has been idle ``N - 1``
seconds or more is closed instead of reused (a new one is opened in its place), a
second short of the announcement as other clients do (Node itself closes a second
after it, Apache at it). Without the field nothing changes.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

__all__ = ["KEEP_ALIVE_MARGIN", "idle_limit", "note"]

log = logging.getLogger(__name__)

#: Seconds short of a server's announced keep-alive timeout at which an idle
#: connection is no longer reused.
KEEP_ALIVE_MARGIN = 1.0
#: A ``Keep-Alive`` field longer than this is ignored.
_MAX_FIELD = 128


@functools.lru_cache(maxsize=64)
def idle_limit(value: str | None) -> float | None:
    """Seconds a connection may stay idle and still be reused, from a ``Keep-Alive``
    field (``timeout=5, max=100``): its ``timeout`` less :data:`KEEP_ALIVE_MARGIN`, at
    least 0. None: no field, no valid ``timeout``."""
    if value is None or len(value) > _MAX_FIELD:
        return None
    for part in value.split(","):
        name, _, number = part.partition("=")
        if name.strip(" \t").lower() == "timeout":
            text = number.strip(" \t")
            if text.isascii() and text.isdigit() and len(text) <= 9:
                return max(0.0, int(text) - KEEP_ALIVE_MARGIN)
            return None
    return None


class _IdleAware:
    """The mark of a pool class made idle-aware by :func:`_idle_aware`."""


@functools.cache
def _idle_aware(pool_class: Any) -> Any:
    """``pool_class`` (a urllib3 connection pool) that reads each answer's
    ``Keep-Alive`` and, before the next request on that connection, closes it when it
    has been idle past that (the request then goes out on a new one, as urllib3 does
    for a connection found dropped). Idle is counted from the answer's arrival (a
    little longer than from the body's end: it errs towards a new connection). One
    method, bound here once: it runs on every request."""
    if issubclass(pool_class, _IdleAware):
        return pool_class
    base_request = pool_class._make_request
    monotonic = time.monotonic

    def _make_request(self: Any, conn: Any, *args: Any, **kwargs: Any) -> Any:
        limit = getattr(conn, "_raa_idle_limit", None)
        if limit is not None and monotonic() - conn._raa_idle_since >= limit:
            log.debug("closing a connection idle past the server's keep-alive timeout")
            conn.close()
        response = base_request(self, conn, *args, **kwargs)
        headers = getattr(response, "headers", None)
        if headers is not None and "keep-alive" in headers:
            conn._raa_idle_limit = idle_limit(headers.get("keep-alive"))
            conn._raa_idle_since = monotonic()
        elif limit is not None:
            conn._raa_idle_limit = None  # the last answer says
        return response

    members = {"__module__": __name__, "_make_request": _make_request}
    return type(pool_class.__name__, (_IdleAware, pool_class), members)


def note(response: Any) -> None:
    """After an attempt's answer (a urllib3 response): when it announces
    ``Keep-Alive``, its pool becomes idle-aware (once; its class is swapped for the
    subclass, which adds one method) and its connection is stamped. Pools of servers
    that announce nothing are left as urllib3 made them: this test is all they pay."""
    headers = getattr(response, "headers", None)
    if headers is None:
        return
    names = getattr(headers, "_container", None)  # urllib3's, by lower-case name: a dict look-up
    if "keep-alive" not in (names if type(names) is dict else headers):
        return
    pool = getattr(response, "_pool", None)
    if pool is None or isinstance(pool, _IdleAware):
        return
    try:
        pool.__class__ = _idle_aware(pool.__class__)
    except TypeError:  # a pool class whose layout a subclass cannot take over
        return
    conn = getattr(response, "_connection", None)
    if conn is not None:
        conn._raa_idle_limit = idle_limit(headers.get("keep-alive"))
        conn._raa_idle_since = time.monotonic()
