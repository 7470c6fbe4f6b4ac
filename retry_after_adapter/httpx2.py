"""httpx2 transports that defer instead of shortening: the same as
:mod:`retry_after_adapter.httpx`, for httpx2 (the HTTP client of the OpenAI and
Anthropic SDKs).

``pip install 'retry_after_adapter[httpx2]'``. The names, keywords, deferrals, result
shape and stores are :mod:`retry_after_adapter.httpx`'s, on one implementation
(``retry_after_adapter._httpx_family``)::

    transport = RetryAfterTransport(RetryAfterRetry(total=3, max_wait=5), max_concurrency=8)
    client = httpx2.Client(transport=transport)

A transport error of the last attempt is raised as httpx2 raises it
(``httpx2.ReadTimeout``, ``httpx2.ConnectError``...), carrying the deferral when there
is one.
"""

from __future__ import annotations

try:
    import httpx2
except ImportError as missing:  # pragma: no cover - the extra is not installed
    raise ImportError(
        "retry_after_adapter.httpx2 needs httpx2: pip install 'retry_after_adapter[httpx2]'"
    ) from missing

from ._httpx_family import STORE_THREADS, AsyncFront, Flavour, SyncFront

__all__ = ["STORE_THREADS", "AsyncRetryAfterTransport", "RetryAfterTransport"]

#: What this module's transports read of httpx2.
FLAVOUR = Flavour(httpx2)


class RetryAfterTransport(SyncFront, httpx2.BaseTransport):
    """An ``httpx2`` transport that obeys Retry-After exactly and shares cooldowns:
    :class:`retry_after_adapter.httpx.RetryAfterTransport` for ``httpx2.Client``
    (default inner transport ``httpx2.HTTPTransport()``)."""

    flavour = FLAVOUR


class AsyncRetryAfterTransport(AsyncFront, httpx2.AsyncBaseTransport):
    """:class:`RetryAfterTransport` for ``httpx2.AsyncClient`` (default inner transport
    ``httpx2.AsyncHTTPTransport()``): :class:`retry_after_adapter.httpx.AsyncRetryAfterTransport`
    for httpx2."""

    flavour = FLAVOUR
