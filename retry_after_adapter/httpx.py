"""httpx transports that defer instead of shortening, on the same engine and stores.

``pip install 'retry_after_adapter[httpx]'``; the rest of the package works without
httpx. :class:`RetryAfterTransport` (``httpx.Client``) and
:class:`AsyncRetryAfterTransport` (``httpx.AsyncClient``) wrap another transport
(default: ``httpx.HTTPTransport()`` / ``httpx.AsyncHTTPTransport()``) and take the
policy first and the same keywords as :class:`~retry_after_adapter.RetryAfterAdapter`::

    transport = RetryAfterTransport(RetryAfterRetry(total=3, max_wait=5), max_concurrency=8)
    client = httpx.Client(transport=transport)

Each request runs the engine's one loop (:func:`retry_after_adapter.engine.steps`):
the synchronous transport drives it here, the async one on the event loop, where every
wait is ``await``-ed on the clock (no thread waits) and the store operations of a store
other than a memory store run on a small thread pool of the transport's, so the loop
never blocks on SQLite or Redis. The result has the shape of the other front ends':

- a deferral after a response returns that response, its body read (bounded), with
  ``response.deferral`` set (read it with :func:`~retry_after_adapter.deferral_of`);
- a deferral before anything was sent returns a local 429 (``X-Local-Deferral``,
  ``Retry-After``, the deferral as JSON) whose ``local`` is True;
- when the last attempt fails in transport, the exception httpx raises
  (``httpx.ReadTimeout``, ``httpx.ConnectError``...) is raised, and carries the
  deferral when there is one;
- ``raise_on_defer=True`` raises :class:`~retry_after_adapter.RetryDeferred` instead.

httpx follows redirects itself: each hop comes back through the transport and
continues the same call (its budget and counts), as with requests. The same
transports for httpx2 are :mod:`retry_after_adapter.httpx2` (one implementation:
``retry_after_adapter._httpx_family``).
"""

from __future__ import annotations

try:
    import httpx
except ImportError as missing:  # pragma: no cover - the extra is not installed
    raise ImportError(
        "retry_after_adapter.httpx needs httpx: pip install 'retry_after_adapter[httpx]'"
    ) from missing

from ._httpx_family import STORE_THREADS, AsyncFront, Flavour, SyncFront

__all__ = ["STORE_THREADS", "AsyncRetryAfterTransport", "RetryAfterTransport"]

#: What this module's transports read of httpx.
FLAVOUR = Flavour(httpx)


class RetryAfterTransport(SyncFront, httpx.BaseTransport):
    """An ``httpx`` transport that obeys Retry-After exactly and shares cooldowns.

    ``max_retries`` (the policy: a :class:`RetryAfterRetry`, an int, a stock ``Retry``
    or None) and every keyword as for :class:`~retry_after_adapter.RetryAfterAdapter`
    (``cooldown``, ``scope``, ``raise_on_defer``, ``store_failure``, ``on_decision``,
    ``quota``, ``max_concurrency``, ``lease_ttl``, ``max_waiting``, ``learn_rate``,
    ``replay_unprocessed``: here True by default, so a POST that OpenAI or Anthropic
    answers with a 429, which they document as not processed, is sent again once its
    wait, which must fit, has passed, as their SDKs would send it; see docs/behaviour.md);
    ``transport``: the transport each attempt goes through (default
    ``httpx.HTTPTransport()``). Mount it with ``httpx.Client(transport=...)`` or
    ``mounts={...}``; closing the client closes the wrapped transport.
    """

    flavour = FLAVOUR


class AsyncRetryAfterTransport(AsyncFront, httpx.AsyncBaseTransport):
    """:class:`RetryAfterTransport` for ``httpx.AsyncClient`` (default inner transport
    ``httpx.AsyncHTTPTransport()``).

    Waits are awaited on the policy's clock (``SystemClock`` on the event loop;
    ``FakeClock`` moves at once), so a waiting task holds no thread. A memory store is
    used on the loop; any other store (SQLite, Redis, yours) is reached from at most
    :data:`STORE_THREADS` threads of this transport, with the same bounded time per
    operation, breaker and write-back as in threads. A task cancelled while it waits
    or while its attempt is on the wire gets ``CancelledError``, and what it held in
    the store (a concurrency slot) is given back first. ``budget(cancel=...)`` takes an
    ``asyncio.Event``.
    """

    flavour = FLAVOUR
