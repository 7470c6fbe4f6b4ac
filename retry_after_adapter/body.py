"""An attempt's body: when the attempt ends, and how much of a retried body is read.

Both work on the urllib3 response under every transport (``HTTPAdapter`` hands it over
as ``response.raw``, ``PoolManager`` returns it), on urllib3 1.26 and 2.x.

- :func:`on_done`: a concurrency slot covers the whole attempt, body included. The
  attempt ends when urllib3 gives the connection back: the body was read to its end,
  reading it failed, or the response was closed (``requests.Response.close()`` and the
  engine's own closing give the connection back too). That calls ``release`` (once:
  the stores' release of a token already given back does nothing).
- :func:`read_bounded`: a body that is read only to be kept (a response about to be
  retried) is read up to a size bound and within the time the call has left; past
  either the connection is dropped, so an endless or trickling body costs neither
  memory nor the caller's deadline.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["CHUNK", "DEFAULT_MAX_RETRY_BODY", "on_done", "read_bounded"]

#: Bytes of a retried response's body kept by default (1 MiB): an error page fits,
#: an endless body stops there.
DEFAULT_MAX_RETRY_BODY = 1 << 20
#: Bytes asked for per read while keeping a body.
CHUNK = 64 * 1024
#: Reads in a row that decode to nothing (urllib3 1.26, a compressed body) before the
#: body is dropped as broken.
_EMPTY_READS = 1024


def on_done(raw: Any, release: Callable[[], None]) -> None:
    """Call ``release`` when the attempt behind ``raw`` (a urllib3 response) is over:
    now if its body is already read (or it has none), else when its connection is
    given back (``release_conn``).

    The hook holds the response only weakly: a response that held itself through its
    own hook would be a reference cycle, left for the garbage collector on every
    attempt instead of freed when the caller drops it."""
    if raw is None or _finished(raw):
        release()
        return
    prior = getattr(raw, "__dict__", {}).get("release_conn")  # someone's hook on it, if any
    original = prior if prior is not None else getattr(type(raw), "release_conn", None)
    if original is None:  # not a urllib3 response (a mock's): nothing will tell
        release()
        return
    response = weakref.ref(raw)

    def released() -> None:
        try:
            if prior is not None:
                prior()
            else:
                held = response()
                if held is not None:
                    original(held)
        finally:
            release()

    raw.release_conn = released


def _finished(raw: Any) -> bool:
    """Whether nothing more will be read from ``raw``: its body was preloaded or fully
    read (urllib3 closes its file then), or there is no body to read."""
    try:
        return bool(raw.closed)
    except Exception:  # not a urllib3 response (a mock's): treated as unread
        return False


def read_bounded(
    raw: Any, limit: int | None, seconds: float | None, decode: bool | None = True
) -> tuple[bytes, bool]:
    """Read ``raw``'s body (``decode``: decoded as ``requests`` reads it; None: as the
    response is set to, as ``PoolManager`` reads it), at most ``limit`` bytes
    (None: no bound) and for at most ``seconds`` (None: no bound besides the socket's
    own read timeout). Returns ``(body, whole)``; when not ``whole`` (a bound was met,
    or the body broke while being read) the connection was dropped (closed, not
    pooled) and ``body`` is what was read before that. Never raises."""
    chunks: list[bytes] = []
    size = empty = 0
    whole = False
    watchdog = _watchdog(raw, seconds) if seconds is not None else None
    try:
        while limit is None or size <= limit:
            want = CHUNK if limit is None else min(CHUNK, limit + 1 - size)
            data = raw.read(want, decode_content=decode)
            if not data:
                if _finished(raw):
                    whole = True
                    break
                # urllib3 1.26 decodes what it read: a compressed body's first bytes may
                # decode to nothing yet. Go on while bytes remain.
                empty += 1
                if empty > _EMPTY_READS:
                    break
                continue
            chunks.append(data)
            size += len(data)
    except Exception:  # a broken body, or the watchdog cut it: what was read is kept
        whole = False
    finally:
        if watchdog is not None:
            watchdog.cancel()
    body = b"".join(chunks)
    if not whole:
        _drop(raw)
        if limit is not None:
            body = body[:limit]
    return body, whole


def _drop(raw: Any) -> None:
    """Close ``raw`` and its connection (a closed connection in the pool reconnects)."""
    with contextlib.suppress(Exception):
        raw.close()
    with contextlib.suppress(Exception):
        raw.release_conn()


class _Watchdog:
    """Shuts the socket under ``raw`` down after ``seconds``: a blocked read then ends
    at once (a server trickling one byte at a time keeps every single read within the
    socket timeout, so only this bounds the whole read)."""

    def __init__(self, raw: Any, seconds: float) -> None:
        self.raw = raw
        self.lock = threading.Lock()
        self.done = False
        self.timer = threading.Timer(max(0.0, seconds), self._fire)
        self.timer.daemon = True
        self.timer.start()

    def _fire(self) -> None:
        with self.lock:  # never after cancel(): the connection may be someone else's then
            if self.done:
                return
            sock = _socket_of(self.raw)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def cancel(self) -> None:
        with self.lock:
            self.done = True
        self.timer.cancel()


def _watchdog(raw: Any, seconds: float) -> _Watchdog | None:
    if _socket_of(raw) is None:
        return None  # nothing on a socket (a mock's body): nothing can block
    return _Watchdog(raw, seconds)


def _socket_of(raw: Any) -> socket.socket | None:
    connection = getattr(raw, "_connection", None)
    sock = getattr(connection, "sock", None)
    return sock if isinstance(sock, socket.socket) else None
