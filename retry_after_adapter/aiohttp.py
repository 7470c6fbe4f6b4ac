"""An aiohttp client middleware that defers instead of shortening, on the same engine
and stores as the other front ends.

``pip install 'retry_after_adapter[aiohttp]'`` (aiohttp 3.12 or later, the first with
client middlewares); the rest of the package works without aiohttp.
:class:`RetryAfterMiddleware` takes the policy first and the same keywords as
:class:`~retry_after_adapter.RetryAfterAdapter`::

    middleware = RetryAfterMiddleware(RetryAfterRetry(total=3, max_wait=5), max_concurrency=8)
    async with aiohttp.ClientSession(middlewares=(middleware,)) as session:
        ...

Each request runs the engine's one loop (:func:`retry_after_adapter.engine.steps`) on
the event loop, driven as the async httpx transport drives it: every wait is
``await``-ed on the clock (no thread waits), and the store operations of a store other
than a memory store run on a few threads of the middleware's, so the loop never blocks
on SQLite or Redis. Each attempt is the next handler of aiohttp's chain (``await
handler(request)``), so the same request, its body included, is sent again. The result
has the shape of the async httpx transport's:

- a deferral after a response returns that response, its body read (bounded) and
  still readable, with ``response.deferral`` set (read it with
  :func:`~retry_after_adapter.deferral_of`) and ``x-should-retry: false``;
- a deferral before anything was sent (a cooldown, a quota, a concurrency cap) returns
  a local 429 (``X-Local-Deferral``, ``Retry-After``, ``x-should-retry: false``, the
  deferral as JSON) whose ``local`` is True;
- when the last attempt fails in transport, aiohttp's exception
  (``aiohttp.ClientConnectorError``, ``aiohttp.ServerDisconnectedError``...) is raised
  and carries the deferral when there is one;
- ``raise_on_defer=True`` raises :class:`~retry_after_adapter.RetryDeferred` instead
  (:class:`DeferredClientError`, which aiohttp passes on unwrapped).

A body is sent again only when aiohttp holds it whole (bytes, a string, JSON, a form):
a file, a multipart writer or an async iterator is read as it is sent, so a call
carrying one is never replayed (whatever its method); a wait after it is deferred, with
the response. aiohttp follows redirects itself: each hop comes back through the
middleware and continues the same call (its deadline, budget and counts).
aiohttp's ``ClientTimeout(total=...)`` covers the whole call, waits included.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Unpack

try:
    import aiohttp
    from aiohttp import ClientRequest, ClientResponse
    from aiohttp.payload import BytesPayload
except ImportError as missing:  # pragma: no cover - the extra is not installed
    raise ImportError(
        "retry_after_adapter.aiohttp needs aiohttp 3.12 or later: pip install 'retry_after_adapter[aiohttp]'"
    ) from missing
from multidict import CIMultiDict, CIMultiDictProxy
from urllib3.exceptions import ConnectTimeoutError, MaxRetryError, ProtocolError, ReadTimeoutError
from yarl import URL

from ._httpx_family import SHOULD_RETRY, STORE_THREADS, Once, StoreThreads, drive_async
from .deferral import Deferral
from .deferred import RetryDeferred
from .engine import Call, Outcome, steps
from .errors import ConfigurationError
from .redact import message_url
from .retry import RetryAfterRetry
from .scope import RequestInfo
from .settings import Options, Settings, SharedSettings, as_retry_after_retry, local_parts, store_name

__all__ = ["STORE_THREADS", "DeferredClientError", "RetryAfterMiddleware"]

Handler = Callable[[ClientRequest], Awaitable[ClientResponse]]

_REDIRECTS = frozenset((301, 302, 303, 307, 308))
#: Failures no other attempt heals: a certificate or a fingerprint, an invalid URL.
_FINAL = (aiohttp.ClientSSLError, aiohttp.ServerFingerprintMismatch, aiohttp.InvalidURL)
#: Failures after the request went out (a reset, a disconnect, a broken body), which
#: another attempt may heal.
_BROKEN = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError)
#: The call the next hop of a followed redirect continues, with the timer aiohttp gives
#: every hop of one ``session.request()`` (a hop runs in the task that set this).
_HOP: ContextVar[tuple[Call, object] | None] = ContextVar("retry_after_adapter_aiohttp_hop", default=None)
#: ``allowed_methods`` that no method is in: the policy a call whose body cannot be sent
#: again runs on, so no answer replays it (a POST's rule, for every method).
_NO_METHOD = frozenset({"-"})


def _version() -> tuple[int, ...]:
    parts = []
    for part in aiohttp.__version__.split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


if _version() < (3, 12):  # pragma: no cover - an older aiohttp installed
    raise ImportError(
        f"retry_after_adapter.aiohttp needs aiohttp 3.12 or later (client middlewares); "
        f"aiohttp {aiohttp.__version__} is installed"
    )


class _Fields:
    """A response's headers as the engine reads them: any case, repeated fields joined
    with ", " (aiohttp's ``get`` gives the first only)."""

    __slots__ = ("_headers",)

    def __init__(self, headers: CIMultiDictProxy[str]) -> None:
        self._headers = headers

    def get(self, name: str, default: str | None = None) -> str | None:
        values = self._headers.getall(name, None)
        return ", ".join(values) if values else default

    def __contains__(self, name: object) -> bool:
        return name in self._headers

    def __iter__(self) -> Iterator[str]:
        return iter(self._headers)

    def items(self) -> list[tuple[str, str]]:
        return list(self._headers.items())

    def multi_items(self) -> list[tuple[str, str]]:
        """Each field, its name in lower case (what ``header_getter`` reads)."""
        return [(name.lower(), value) for name, value in self._headers.items()]


class _Raw:
    """What the engine reads of an aiohttp response (as of a urllib3 one)."""

    __slots__ = ("headers", "status")

    status: int
    headers: _Fields

    def get_redirect_location(self) -> str | bool | None:
        return self.headers.get("location") if self.status in _REDIRECTS else False


def replayable(request: ClientRequest) -> bool:
    """Whether ``request`` can be sent again as it is: no body, or one aiohttp holds
    whole (``BytesPayload``: bytes, a string, JSON, an urlencoded form) and has not
    marked consumed. A file, a multipart writer, an async iterator is read as it is
    sent."""
    body = request.body
    if isinstance(body, (bytes, bytearray)):
        return True  # b"": no body
    return isinstance(body, BytesPayload) and not getattr(body, "consumed", False)


class _Attempts:
    """One request's attempts as the engine sees them, each one the next handler of
    aiohttp's chain."""

    follows_redirects = False
    streams = False  # the caller reads the body itself; a kept one stays readable
    user_timeout = None  # aiohttp's timeouts are the session's: bounded here by the deadline

    def __init__(
        self,
        request: ClientRequest,
        handler: Handler,
        url: str,
        offload: Callable[[Callable[[], None]], Any] | None,
    ) -> None:
        self.request = request
        self.handler = handler
        self.method: str = request.method
        self.url = message_url(url)  # what urllib3 counts and logs: no user info, no query
        self.offload = offload
        self.loop = asyncio.get_running_loop()
        self.sent = 0

    @staticmethod
    def raw(response: ClientResponse) -> _Raw:
        raw = object.__new__(_Raw)
        raw.status = response.status
        raw.headers = _Fields(response.headers)
        return raw

    def transport_error(self, exc: Exception) -> Exception | None:
        """The urllib3 failure an aiohttp error stands for (what the retry counters and
        the idempotency guard read), or None when another attempt cannot heal it (a
        certificate, an invalid URL, anything not a transport error). Nothing was sent
        on a connect failure or a connect timeout."""
        if isinstance(exc, _FINAL):
            return None
        if isinstance(exc, (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)):
            return ConnectTimeoutError(type(exc).__name__)
        if isinstance(exc, asyncio.TimeoutError):  # aiohttp's read timeouts are TimeoutErrors
            return ReadTimeoutError(None, self.url, "read timed out")  # type: ignore[arg-type]
        if isinstance(exc, _BROKEN):
            return ProtocolError(type(exc).__name__)
        return None

    async def send(self, timeout: Any) -> ClientResponse:
        """One attempt through the rest of the chain, bounded by what is left of the
        deadline (``timeout``: a urllib3 ``Timeout`` when the engine bounded it)."""
        request = self.request
        if self.sent and not replayable(request):
            # The call's policy replays nothing (see RetryAfterMiddleware.__call__): only
            # a payload aiohttp marked consumed while it was sent lands here.
            raise aiohttp.ClientError(  # not a transport failure: ends the call
                "the request's body was consumed by its first attempt: not sent again"
            )
        self.sent += 1
        left = _left(timeout)
        if left is None:
            return await self.handler(request)
        if _TIMEOUT is None:  # Python 3.10: a task of its own for the attempt
            try:
                return await asyncio.wait_for(self.handler(request), left)
            except asyncio.TimeoutError as exc:
                if isinstance(exc, aiohttp.ClientError):
                    raise  # aiohttp's own read or connect timeout
                raise aiohttp.ServerTimeoutError("the call's deadline ran out") from None
        bound = _TIMEOUT(left)  # in this task: no task made per attempt
        try:
            async with bound:
                return await self.handler(request)
        except asyncio.TimeoutError:
            if bound.expired():
                raise aiohttp.ServerTimeoutError("the call's deadline ran out") from None
            raise  # aiohttp's own read or connect timeout

    async def keep(self, response: ClientResponse, limit: int | None, seconds: float | None) -> bytes | None:
        """Read the body (at most ``limit`` bytes, within ``seconds``; past either the
        connection is dropped) and keep it readable (``read()``, ``text()``,
        ``json()``); return it. Read whole, the connection went back to the pool."""
        kept: bytes | None = response._body
        if kept is not None:
            return kept
        loop = self.loop
        end = None if seconds is None else loop.time() + seconds
        chunks: list[bytes] = []
        size = 0
        whole = False
        try:
            while True:
                if end is None:
                    chunk = await response.content.readany()
                else:
                    chunk = await asyncio.wait_for(response.content.readany(), max(0.0, end - loop.time()))
                if not chunk:
                    whole = True
                    break
                chunks.append(chunk)
                size += len(chunk)
                if limit is not None and size > limit:
                    break
        except (aiohttp.ClientError, asyncio.TimeoutError):
            pass  # a broken or slow body: what was read is kept, the connection dropped
        finally:
            if not whole:
                response.close()  # read whole, aiohttp gave the connection back itself
                # (``release()`` would mark the body released: unreadable)
        data = b"".join(chunks)
        if limit is not None:
            data = data[:limit]
        response._body = data
        return data

    def on_done(self, response: ClientResponse, release: Callable[[], None]) -> None:
        """Give the call's slot back once the response's connection is released or
        closed (its body read, ``release()``, ``close()``, leaving ``async with``);
        at once when it is already. Called on the store's thread for a blocking store:
        the connection is looked at on the loop."""
        once = Once(release)
        offload = self.offload
        done: Callable[[], Any] = once if offload is None else (lambda: offload(once))

        def attach() -> None:
            connection = response.connection
            if connection is None:
                done()
            else:
                connection.add_callback(done)

        if offload is None:
            attach()
        else:
            self.loop.call_soon_threadsafe(attach)

    @staticmethod
    async def close(response: ClientResponse) -> None:
        response.close()

    def follow(self, response: Any, retry: Any) -> None:  # pragma: no cover
        raise AssertionError("aiohttp follows redirects itself")


#: ``asyncio.timeout`` (Python 3.11+), or None.
_TIMEOUT: Any = getattr(asyncio, "timeout", None)


def _left(timeout: Any) -> float | None:
    """Seconds the attempt may take (what the engine left of the deadline), or None."""
    if timeout is None or type(timeout) in (int, float):
        return None
    total = timeout.total if timeout.total is not None else timeout.connect_timeout
    return None if total is None else float(total)


class _NoProtocol:
    """The protocol a local response's stream reports to: nothing is on the wire
    (aiohttp 3.12 reads ``_reading_paused`` at the stream's end)."""

    _reading_paused = False

    def pause_reading(self) -> None: ...

    def resume_reading(self, *args: Any, **kwargs: Any) -> None: ...


def _set_headers(response: ClientResponse, headers: CIMultiDict[str]) -> None:
    """Give ``response`` these header fields (``headers`` and ``raw_headers`` are read
    once and kept by aiohttp: what it kept is dropped)."""
    response._headers = CIMultiDictProxy(headers)
    response._raw_headers = tuple(
        (name.encode("latin-1"), value.encode("latin-1")) for name, value in headers.items()
    )
    cache = getattr(response, "_cache", None)
    if isinstance(cache, dict):
        cache.pop("headers", None)
        cache.pop("raw_headers", None)


def local_response(request: ClientRequest, deferral: Deferral) -> ClientResponse:
    """The 429 for a call deferred before anything was sent (no byte went out): a whole
    ``ClientResponse``, its body the deferral's JSON, readable as any other."""
    headers, body = local_parts(deferral)
    headers[SHOULD_RETRY] = "false"  # an SDK's own retry loop ends here
    loop = asyncio.get_running_loop()
    writer = _Written()
    keywords: dict[str, Any] = {
        "writer": None,
        "continue100": None,
        "timer": None,
        "request_info": request.request_info,
        "traces": [],
        "loop": loop,
        "session": None,
    }
    if _STREAM_WRITER:
        keywords["stream_writer"] = writer
    response = request.response_class(request.method, URL(request.url), **keywords)
    response.status = 429
    response.reason = "Too Many Requests"
    response.version = aiohttp.HttpVersion11
    _set_headers(response, CIMultiDict(headers))
    response._body = body
    stream = aiohttp.StreamReader(_NoProtocol(), 2**16, loop=loop)  # type: ignore[arg-type]
    stream.feed_data(body)
    stream.feed_eof()
    response.content = stream
    response.deferral = deferral  # type: ignore[attr-defined]
    response.stop_reason = None  # type: ignore[attr-defined]
    response.local = True  # type: ignore[attr-defined]
    return response


class _Written:
    """The stream writer of a request that was never sent (aiohttp 3.13+ asks for one)."""

    output_size = 0


def _takes_stream_writer() -> bool:
    import inspect

    return "stream_writer" in inspect.signature(ClientResponse.__init__).parameters


_STREAM_WRITER = _takes_stream_writer()


class DeferredClientError(RetryDeferred, aiohttp.ClientError):
    """The :class:`~retry_after_adapter.RetryDeferred` the middleware raises
    (``raise_on_defer=True``, a deferred redirect): also an ``aiohttp.ClientError``, so
    aiohttp hands it to the caller as it is (it wraps any other ``OSError`` in its
    ``ClientOSError``)."""


class RetryAfterMiddleware(StoreThreads, SharedSettings):
    """An aiohttp client middleware that obeys Retry-After exactly and shares cooldowns.

    ``retry`` (the policy: a :class:`RetryAfterRetry`, an int, a stock ``Retry`` or
    None) and every keyword as for :class:`~retry_after_adapter.RetryAfterAdapter`
    (``cooldown``, ``scope``, ``raise_on_defer``, ``store_failure``, ``on_decision``,
    ``quota``, ``max_concurrency``, ``lease_ttl``, ``max_waiting``, ``learn_rate``,
    ``cost``, ``replay_unprocessed``: True by default, as for the httpx transports).
    Give it to ``aiohttp.ClientSession(middlewares=(...,))`` or to one request
    (``session.get(url, middlewares=(...,))``).

    Waits are awaited on the policy's clock (``SystemClock`` on the event loop;
    ``FakeClock`` moves at once), so a waiting task holds no thread. A memory store is
    used on the loop; any other store is reached from at most :data:`STORE_THREADS`
    threads of this middleware. A task cancelled while it waits or while its attempt is
    on the wire gets ``CancelledError``, and what it held in the store (a concurrency
    slot) is given back first; ``budget(cancel=...)`` takes an ``asyncio.Event``.
    :meth:`close` ends the store's threads (the store itself is the caller's).
    """

    #: A POST a provider's 429 says was not processed is sent again after the wait, as
    #: with the httpx transports (see ``Settings.replay_unprocessed``).
    replays_unprocessed = True

    def __init__(self, retry: Any = None, **options: Unpack[Options]) -> None:
        self.max_retries: RetryAfterRetry = as_retry_after_retry(retry)
        keywords: dict[str, Any] = dict(options)
        settings = Settings.take(keywords)
        Settings.refuse_unknown(type(self).__name__, keywords, ())
        self._share(settings)

    async def __call__(self, request: ClientRequest, handler: Handler) -> ClientResponse:
        if not isinstance(request, ClientRequest):
            raise ConfigurationError(
                f"{type(self).__name__} is an aiohttp client middleware: "
                "give it to aiohttp.ClientSession(middlewares=(...,))"
            )
        url = str(request.url)
        call = self._start(request, url)
        pool = self._threads() if self._blocking else None  # None: the steps run on the loop
        offload = self._offload if pool is not None else None
        attempts = _Attempts(request, handler, url, offload)
        outcome = await drive_async(call, attempts, steps(call, attempts), pool)
        result: ClientResponse = self._result(request, call, outcome)
        return result

    def _start(self, request: ClientRequest, url: str) -> Call:
        """The call ``request`` continues (the next hop of a redirect aiohttp follows:
        its deadline, budget and counts go on), or a new one."""
        info = RequestInfo(request.method, url, request.headers)
        entry = _HOP.get()
        if entry is not None:
            _HOP.set(None)
            if entry[1] is request._timer:
                call = entry[0]
                call.continue_on(self._plan, self._scope_fn(info))
                call.progress.resendable = call.progress.resendable and replayable(request)
                return call
        call = self._call(self.max_retries, info, request)
        if not replayable(request):
            call.retry = self._sent_once()
            call.progress.resendable = False
        return call

    def _sent_once(self) -> RetryAfterRetry:
        """The policy a call whose body cannot be sent again runs on: ``max_retries``
        with no method replayed (made once per policy)."""
        kept: tuple[RetryAfterRetry, RetryAfterRetry] | None = self.__dict__.get("_once")
        if kept is None or kept[0] is not self.max_retries:
            kept = self._once = (self.max_retries, self.max_retries.new(allowed_methods=_NO_METHOD))
        return kept[1]

    def close(self) -> None:
        """End the threads the middleware reaches a blocking store from (made again
        when a later call needs them)."""
        self._close_threads()

    # -- the result's shape (see SharedSettings._result) --------------------------------

    def _failed(self, request: Any, error: BaseException, deferral: Deferral | None) -> BaseException:
        if deferral is not None:
            error.deferral = deferral  # type: ignore[attr-defined]
        return error

    def _local(self, request: Any, deferral: Deferral) -> Any:
        return local_response(request, deferral)

    def _adopt(self, request: Any, response: Any, outcome: Outcome[Any]) -> Any:
        response.deferral = outcome.deferral
        response.stop_reason = outcome.stop_reason
        response.local = False
        if outcome.deferral is not None and not outcome.fits:
            # Deferred: final inside a caller's own retry loop too (see the httpx transports).
            headers = CIMultiDict(response.headers)
            headers[SHOULD_RETRY] = "false"
            _set_headers(response, headers)
        return response

    def _finished(self, request: Any, call: Call, response: Any, outcome: Outcome[Any]) -> Any:
        if outcome.redirect:
            _HOP.set((call, request._timer))  # aiohttp follows it: the next hop continues this call
        return response

    def _deferred(
        self, request: Any, call: Call, deferral: Deferral, response: Any, limit: MaxRetryError | None
    ) -> RetryDeferred:
        reason = limit.reason if limit is not None else None
        return DeferredClientError(deferral, response=response, request=request, reason=reason)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.max_retries!r}, cooldown={store_name(self.settings.cooldown)})"
