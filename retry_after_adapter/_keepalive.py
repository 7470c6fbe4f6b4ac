"""Connections idle past the server's announced keep-alive timeout are not reused.

A server may close a kept-alive connection once it has been idle for a while, and a
client that sends on it at that moment loses the request (``RemoteDisconnected`` or a
reset): it never reached the server, yet it was admitted, and it is sent again. Many
servers say how long they keep an idle connection (``Keep-Alive: timeout=5``, as
Node's http server and Apache send); urllib3 does not read it. The pools of the
adapter and of :class:`~retry_after_adapter.RetryAfterPoolManager` do: a connection
whose last answer announced ``timeout=N`` and that has been idle ``N - 1`` seconds or
more is closed instead of reused (a new one is opened in its place), a second short of
the announcement as other clients do (Node itself closes a second after it, Apache at
it). Without the field nothing changes.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

__all__ = ["KEEP_ALIVE_MARGIN", "idle_limit", "install"]

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
    """Mixed into a urllib3 connection pool: stamps a connection when it comes back to
    the pool, reads each answer's ``Keep-Alive``, and closes a connection idle past
    it before handing it out."""

    def _put_conn(self, conn: Any) -> None:
        if conn is not None:
            conn._raa_idle_since = time.monotonic()
        super()._put_conn(conn)  # type: ignore[misc]

    def _get_conn(self, timeout: Any = None) -> Any:
        conn = super()._get_conn(timeout)  # type: ignore[misc]
        limit = getattr(conn, "_raa_idle_limit", None)
        if limit is not None:
            since = getattr(conn, "_raa_idle_since", None)
            if since is not None and time.monotonic() - since >= limit:
                log.debug("closing a connection idle past the server's keep-alive timeout")
                conn.close()
                conn._raa_idle_limit = None
        return conn

    def _make_request(self, conn: Any, *args: Any, **kwargs: Any) -> Any:
        response = super()._make_request(conn, *args, **kwargs)  # type: ignore[misc]
        headers = getattr(response, "headers", None)
        if headers is not None:
            conn._raa_idle_limit = idle_limit(headers.get("Keep-Alive"))
        return response


@functools.cache
def _idle_aware(pool_class: type) -> type:
    if issubclass(pool_class, _IdleAware):
        return pool_class
    return type(pool_class.__name__, (_IdleAware, pool_class), {"__module__": __name__})


def install(manager: Any) -> Any:
    """Make ``manager`` (a urllib3 ``PoolManager`` or ``ProxyManager``) build its pools
    idle-aware from now on; returns it."""
    classes = getattr(manager, "pool_classes_by_scheme", None)
    if isinstance(classes, dict):
        manager.pool_classes_by_scheme = {scheme: _idle_aware(cls) for scheme, cls in classes.items()}
    return manager
