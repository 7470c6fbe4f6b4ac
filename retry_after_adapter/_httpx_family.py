"""The httpx family's transports, written once for every flavour of httpx.

:mod:`retry_after_adapter.httpx` and :mod:`retry_after_adapter.httpx2` each make one
:class:`Flavour` of the module they wrap (its exceptions, its response and stream types,
its default transports) and two small public classes on :class:`SyncFront` and
:class:`AsyncFront`; everything else (attempts, bodies kept and handed back, the async
driver) is here, once. Requests and responses are typed ``Any``: two flavours' types are
distinct to mypy, and each public class checks against its own flavour's base class.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Unpack

from urllib3.exceptions import ConnectTimeoutError, MaxRetryError, ProtocolError, ReadTimeoutError
from urllib3.util.retry import Retry

from . import _forksafe
from .deferral import Deferral
from .deferred import RetryDeferred
from .engine import (
    STORE_STEPS,
    Call,
    Close,
    Follow,
    Keep,
    Op,
    Outcome,
    Send,
    Sleep,
    StoreOp,
    carry_out_store,
    drive,
    steps,
)
from .redact import message_url
from .retry import RetryAfterRetry
from .scope import RequestInfo
from .settings import Options, Settings, SharedSettings, as_retry_after_retry, local_parts, store_name

__all__ = ["AsyncFront", "Flavour", "StoreThreads", "SyncFront"]

#: Where a call waits between redirect hops: httpx builds each hop's request with the
#: same ``extensions`` dict.
_CALL_KEY = "retry_after_adapter.call"
_REDIRECTS = frozenset((301, 302, 303, 307, 308))
#: The field the OpenAI and Anthropic SDKs (and any client generated as theirs are) obey
#: before their own retry: a deferred response carries ``false``, unless it is the
#: answer to a request not replayed whose wait fits the call (``Outcome.fits``).
SHOULD_RETRY = "x-should-retry"
#: Threads each async transport keeps for the store operations of a blocking store.
STORE_THREADS = 8
_POOL_LOCK = threading.Lock()


def _new_lock() -> None:
    """In a forked child: a parent thread may have held the lock."""
    global _POOL_LOCK
    _POOL_LOCK = threading.Lock()


_forksafe.at_fork(_new_lock)


class Flavour:
    """What differs between two flavours of httpx (``httpx``, ``httpx2``): the module's
    exceptions, response and stream types and default transports, read once from it;
    and the two body streams, made here as subclasses of its own stream classes (its
    ``Response`` checks them by type)."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.name: str = module.__name__
        self.Response: Any = module.Response
        self.ByteStream: Any = module.ByteStream
        self.HTTPError: type[Exception] = module.HTTPError
        self.ReadTimeout: Any = module.ReadTimeout
        self.nothing_sent: tuple[type[Exception], ...] = (
            module.ConnectError, module.ConnectTimeout, module.PoolTimeout, module.ProxyError,
        )
        self.broken: tuple[type[Exception], ...] = (
            module.ReadError, module.WriteError, module.WriteTimeout, module.RemoteProtocolError,
        )
        self.SyncBody: Any = type("_SyncBody", (_SyncBody, module.SyncByteStream), {})
        self.AsyncBody: Any = type("_AsyncBody", (_AsyncBody, module.AsyncByteStream), {})

    def cause(self, exc: Exception, url: str) -> Exception | None:
        """The urllib3 failure a transport error stands for (what the retry counters
        and the idempotency guard read), or None when another attempt cannot heal it
        (an unsupported scheme, a local protocol error, anything not a transport error).
        Nothing was sent on a connect failure, a proxy failure or a pool timeout."""
        if isinstance(exc, self.nothing_sent):
            return ConnectTimeoutError(type(exc).__name__)
        if isinstance(exc, self.ReadTimeout):
            return ReadTimeoutError(None, url, "read timed out")  # type: ignore[arg-type]
        if isinstance(exc, self.broken):
            return ProtocolError(type(exc).__name__)
        return None

    def local(self, request: Any, deferral: Deferral) -> Any:
        """The 429 for a call deferred before anything was sent (no byte went out)."""
        headers, body = local_parts(deferral)
        headers[SHOULD_RETRY] = "false"  # an SDK's own retry loop (OpenAI's, Anthropic's) ends here
        response = self.Response(429, headers=headers, content=body, request=request)
        response.deferral = deferral
        response.stop_reason = None
        response.local = True
        return response

    def __repr__(self) -> str:
        return f"Flavour({self.name})"


class _Raw:
    """What the engine reads of an httpx response (as of a urllib3 one): the status,
    the headers (case-insensitive, repeated fields joined), the redirect target."""

    __slots__ = ("headers", "status")

    status: int
    headers: Any

    def get_redirect_location(self) -> str | bool | None:
        return self.headers.get("location") if self.status in _REDIRECTS else False


_TIMEOUTS = ("connect", "read", "write", "pool")


def _longest(request: Any) -> float | None:
    """The request's longest timeout in seconds (None: one of them is unbounded), what
    the engine bounds by the deadline (:meth:`Call.attempt_timeout`)."""
    given = request.extensions.get("timeout")
    if not given:
        return None
    values = given.values()
    # httpx times four phases (pool, connect, write, read) where urllib3 times two: the
    # engine checks "twice this fits", so this is twice the longest.
    return None if None in values or len(given) < len(_TIMEOUTS) else 2.0 * float(max(values))


def _bounded(request: Any, timeout: Any) -> float | None:
    """Bound each of the request's timeouts by what the engine leaves of the deadline:
    ``timeout`` is what it made of ``longest`` (that number when they fit, else a
    urllib3 ``Timeout`` whose ``total`` is what is left). Returns what is left
    (seconds) when the request had to be bounded, else None."""
    if timeout is None or type(timeout) in (int, float):
        return None
    left = float(timeout.total if timeout.total is not None else timeout.connect_timeout)
    given = request.extensions.get("timeout") or {}
    request.extensions["timeout"] = {
        name: left if given.get(name) is None else min(float(given[name]), left) for name in _TIMEOUTS
    }
    return left


class _Attempts:
    """What both transports share: one request's attempts as the engine sees them."""

    follows_redirects = False
    streams = False  # the client reads the body itself; a kept one stays readable

    def __init__(
        self,
        flavour: Flavour,
        inner: Any,
        request: Any,
        url: str,
        offload: Callable[[Callable[[], None]], Future[None]] | None = None,
    ) -> None:
        self.flavour = flavour
        #: The transport each attempt goes through, and how a blocking release is run
        #: off the event loop (async, with a blocking store; else None).
        self.inner = inner
        self.offload = offload
        self.request = request
        self.method = request.method
        self.url: str = message_url(url)  # what urllib3 counts and logs: no user info, no query
        #: The request's longest timeout: bounded by the deadline in send().
        self.user_timeout = _longest(request)

    @staticmethod
    def raw(response: Any) -> _Raw:
        raw = object.__new__(_Raw)  # two fields: no __init__ frame per attempt
        raw.status = response.status_code
        raw.headers = response.headers
        return raw

    def transport_error(self, exc: Exception) -> Exception | None:
        return self.flavour.cause(exc, self.url)

    def follow(self, response: Any, retry: Retry) -> None:  # pragma: no cover
        raise AssertionError("httpx follows redirects itself")


def _kept(flavour: Flavour, response: Any, data: bytes, limit: int | None) -> bytes:
    """The body read (at most ``limit`` bytes) handed back as a stream of its own, so
    that the client reads and closes the response as it does any other (its
    ``elapsed`` set, its hooks run); the connection it came on is given back already."""
    if limit is not None:
        data = data[:limit]
    response.stream = flavour.ByteStream(data)
    response.is_closed = False
    response.is_stream_consumed = False
    if hasattr(response, "_content"):
        del response._content
    return data


class Once:
    """``release`` called once, however often the stream is closed."""

    __slots__ = ("release",)

    def __init__(self, release: Callable[[], None]) -> None:
        self.release: Callable[[], None] | None = release

    def __call__(self) -> None:
        release, self.release = self.release, None
        if release is not None:
            release()


class _SyncBody:
    """A response's stream that gives the call's slot back once closed (a flavour's
    ``SyncBody`` is this and its own ``SyncByteStream``)."""

    def __init__(self, stream: Any, done: Once) -> None:
        self._stream = stream
        self._done = done

    def __iter__(self) -> Iterator[bytes]:
        yield from self._stream

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            self._done()


class _SyncAttempts(_Attempts):
    def send(self, timeout: Any) -> Any:
        _bounded(self.request, timeout)
        return self.inner.handle_request(self.request)

    def keep(self, response: Any, limit: int | None, seconds: float | None) -> bytes | None:
        """Read the body (at most ``limit`` bytes, within ``seconds``; past either the
        connection is dropped) and keep it readable; return it."""
        if response.is_stream_consumed:
            return response.content if hasattr(response, "_content") else None
        end = None if seconds is None else time.monotonic() + seconds
        chunks: list[bytes] = []
        size = 0
        try:
            for chunk in response.iter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                if (limit is not None and size > limit) or (end is not None and time.monotonic() > end):
                    break
        except self.flavour.HTTPError:
            pass  # a broken body: what was read is kept, the connection dropped
        finally:
            response.close()
        return _kept(self.flavour, response, b"".join(chunks), limit)

    def on_done(self, response: Any, release: Callable[[], None]) -> None:
        if response.is_closed:
            release()
            return
        response.stream = self.flavour.SyncBody(response.stream, Once(release))

    @staticmethod
    def close(response: Any) -> None:
        response.close()


class _AsyncBody:
    """:class:`_SyncBody` for async streams."""

    def __init__(
        self, stream: Any, done: Once, offload: Callable[[Callable[[], None]], Future[None]] | None
    ) -> None:
        # ``offload(fn)`` hands ``fn`` to the store's threads without waiting for it: a
        # cancel landing in ``aclose`` must not drop the slot's release.
        self._stream = stream
        self._done = done
        self._offload = offload

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            if self._offload is None:
                self._done()
            else:
                handed = self._offload(self._done)
                if handed is not None and _forksafe.forked_child():
                    # A forked child may leave by os._exit once the call returns: the
                    # slot goes back first (shielded: a cancel does not drop it).
                    await asyncio.shield(asyncio.wrap_future(handed))


class _AsyncAttempts(_Attempts):
    async def send(self, timeout: Any) -> Any:
        left = _bounded(self.request, timeout)
        if left is None:
            return await self.inner.handle_async_request(self.request)
        # Bounded: the four phases together within what is left, not each of them.
        try:
            return await asyncio.wait_for(self.inner.handle_async_request(self.request), left)
        except asyncio.TimeoutError:
            raise self.flavour.ReadTimeout("the call's deadline ran out", request=self.request) from None

    async def keep(self, response: Any, limit: int | None, seconds: float | None) -> bytes | None:
        """As the synchronous ``keep``, on the event loop."""
        if response.is_stream_consumed:
            return response.content if hasattr(response, "_content") else None
        loop = asyncio.get_running_loop()
        end = None if seconds is None else loop.time() + seconds
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in response.aiter_bytes():
                chunks.append(chunk)
                size += len(chunk)
                if (limit is not None and size > limit) or (end is not None and loop.time() > end):
                    break
        except self.flavour.HTTPError:
            pass
        finally:
            await response.aclose()
        return _kept(self.flavour, response, b"".join(chunks), limit)

    def on_done(self, response: Any, release: Callable[[], None]) -> None:
        if response.is_closed:
            release()  # here, in the step (on the store's thread when it blocks)
            return
        response.stream = self.flavour.AsyncBody(response.stream, Once(release), self.offload)

    @staticmethod
    async def close(response: Any) -> None:
        await response.aclose()


class _Front(SharedSettings):
    """The settings and result shape both transports share; ``flavour`` is the public
    class's."""

    flavour: Flavour
    #: A POST a provider's 429 says was not processed is sent again after the wait (the
    #: SDKs that run on httpx would send it again themselves; httpx has no rule of its own).
    replays_unprocessed = True

    def __init__(self, max_retries: Any = None, *, transport: Any = None, **options: Unpack[Options]) -> None:
        #: The transport each attempt goes through (made here when none is given).
        self.transport = transport if transport is not None else self._default_transport()
        self._own_transport = transport is None
        self.max_retries: RetryAfterRetry = as_retry_after_retry(max_retries)
        keywords: dict[str, Any] = dict(options)
        settings = Settings.take(keywords)
        Settings.refuse_unknown(type(self).__name__, keywords, ("max_retries", "transport"))
        self._share(settings)
        _forksafe.register(self)

    def _after_fork(self) -> None:
        """In a forked child: the connections the transport made here keeps alive are
        the parent's (a child reading from one takes the parent's answer, or waits for
        it): the child gets a transport of its own, made at its first request (one
        given is the caller's)."""
        if self._own_transport:
            self.transport = None

    def _transport(self) -> Any:
        """The transport each attempt goes through (made again in a forked child)."""
        transport = self.transport
        if transport is None:
            transport = self.transport = self._default_transport()
        return transport

    def _default_transport(self) -> Any:
        raise NotImplementedError

    def _start(self, request: Any, url: str) -> Call:
        """The call ``request`` (to ``url``) continues (a redirect hop of it), or a new one."""
        info = RequestInfo(request.method, url, request.headers)
        entry = request.extensions.pop(_CALL_KEY, None) if _CALL_KEY in request.extensions else None
        if entry is not None and entry[1] is not request:
            call: Call = entry[0]
            call.continue_on(self._plan, self._scope_fn(info))
            call.progress.resendable = self._resendable(request)
            return call
        call = self._call(self.max_retries, info, request)
        if not self._resendable(request):
            call.progress.resendable = False
        return call

    def _resendable(self, request: Any) -> bool:
        """Whether ``request`` can be sent again as it is: its body held whole (bytes,
        JSON, a form; an empty one), not a stream read as it is sent (a generator, a
        file: ``IteratorByteStream``, ``MultipartStream``)."""
        return isinstance(request.stream, self.flavour.ByteStream) or hasattr(request, "_content")

    def _failed(
        self, request: Any, error: BaseException, deferral: Deferral | None
    ) -> BaseException:
        if deferral is not None:
            error.deferral = deferral  # type: ignore[attr-defined]
        return error

    def _local(self, request: Any, deferral: Deferral) -> Any:
        return self.flavour.local(request, deferral)

    def _adopt(
        self, request: Any, response: Any, outcome: Outcome[Any]
    ) -> Any:
        response.deferral = outcome.deferral
        response.stop_reason = outcome.stop_reason
        response.local = False
        if outcome.deferral is not None and not outcome.fits:
            # Deferred: final inside an SDK's own retry loop too (it would sleep, then
            # send inside the budget the caller gave, or a server's x-should-retry: true).
            # A request not replayed whose wait fits is left to the SDK's own retry: it
            # waits, and its attempt is admitted once the cooldown ends.
            response.headers[SHOULD_RETRY] = "false"
        return response

    def _finished(
        self, request: Any, call: Call, response: Any, outcome: Outcome[Any]
    ) -> Any:
        if outcome.redirect:
            request.extensions[_CALL_KEY] = (call, request)  # the next hop continues this call
        return response

    def _deferred(
        self,
        request: Any,
        call: Call,
        deferral: Deferral,
        response: Any,
        limit: MaxRetryError | None,
    ) -> RetryDeferred:
        reason = limit.reason if limit is not None else None
        return RetryDeferred(deferral, response=response, request=request, reason=reason)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.max_retries!r}, cooldown={store_name(self.settings.cooldown)})"


class SyncFront(_Front):
    """The synchronous transport of a flavour (its public class adds the flavour and
    the flavour's ``BaseTransport``)."""

    def _default_transport(self) -> Any:
        return self.flavour.module.HTTPTransport()

    def handle_request(self, request: Any) -> Any:
        url = str(request.url)
        call = self._start(request, url)
        attempts = _SyncAttempts(self.flavour, self._transport(), request, url)
        return self._result(request, call, drive(call, attempts, steps(call, attempts)))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class StoreThreads:
    """What an async front end (the httpx transports, the aiohttp middleware) keeps to
    reach a blocking store off the event loop: at most :data:`STORE_THREADS` threads,
    made at the first call that needs them (again in a forked child)."""

    _plan: Any
    _blocking = False
    _pool: ThreadPoolExecutor | None = None
    _pool_pid = 0

    def _published(self) -> None:
        # A store kept in this process's memory is used on the loop; any other may block.
        self._blocking = self._plan.blocking

    def _threads(self) -> ThreadPoolExecutor:
        pool = self._pool
        if pool is None or self._pool_pid != os.getpid():  # made lazily, again after a fork
            with _POOL_LOCK:
                if self._pool is None or self._pool_pid != os.getpid():
                    self._pool = ThreadPoolExecutor(STORE_THREADS, thread_name_prefix="retry-after-store")
                    self._pool_pid = os.getpid()
                pool = self._pool
        return pool

    def _offload(self, fn: Callable[[], None]) -> Future[None]:
        return self._threads().submit(fn)

    def _close_threads(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False)


class AsyncFront(StoreThreads, _Front):
    """The async transport of a flavour (see :class:`SyncFront`). Waits are awaited on
    the policy's clock; a memory store is used on the loop, any other store from at
    most :data:`STORE_THREADS` threads of this transport; a task cancelled while it
    waits or while its attempt is on the wire gives back what it held first."""

    def _default_transport(self) -> Any:
        return self.flavour.module.AsyncHTTPTransport()

    async def handle_async_request(self, request: Any) -> Any:
        url = str(request.url)
        call = self._start(request, url)
        pool = self._threads() if self._blocking else None  # None: the steps run on the loop
        offload = self._offload if pool is not None else None
        attempts = _AsyncAttempts(self.flavour, self._transport(), request, url, offload)
        return self._result(request, call, await drive_async(call, attempts, steps(call, attempts), pool))

    async def aclose(self) -> None:
        if self.transport is not None:
            await self.transport.aclose()
        self._close_threads()


async def drive_async(
    call: Call, attempts: Any, gen: Generator[Op, Any, Outcome[Any]], pool: Any
) -> Outcome[Any]:
    """The async driver of the engine's steps, on the event loop (``attempts``: an
    :class:`_AsyncAttempts`, or the aiohttp middleware's, with the same coroutines): each wait awaited on
    the call's clock, each transport operation awaited, each store operation run here
    for a memory store or on ``pool`` (a blocking store), in the task's context. An
    error (a cancel) is thrown into the steps, which give back what they hold."""
    context = contextvars.copy_context() if pool is not None else None
    store_steps = STORE_STEPS
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            op = gen.send(value) if error is None else gen.throw(error)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        error = None
        try:
            store_step = store_steps.get(type(op))
            if isinstance(op, Send):  # awaited here: one coroutine less on every request's wire wait
                value = await attempts.send(op.timeout)
            elif store_step is None:
                value = await _carry_out(call, attempts, op)
            elif context is None:  # a memory store: no I/O, here on the loop
                value = store_step(call, op)
            else:
                value = await _on_pool(pool, context, call, op)  # type: ignore[arg-type]
        except BaseException as exc:  # thrown back in: the steps clean up, or handle it
            value, error = None, exc


async def _on_pool(pool: Any, context: contextvars.Context, call: Call, op: StoreOp) -> Any:
    """A store step on the store's threads. Once begun it ends, however often the task
    is cancelled meanwhile (a store operation's time is bounded): a cancel is raised
    after it, so the steps know what it took and give it back."""
    step = asyncio.get_running_loop().run_in_executor(pool, context.run, carry_out_store, call, op)
    try:
        return await asyncio.shield(step)
    except asyncio.CancelledError:
        if not step.done():
            await _finish(step)
        raise


async def _carry_out(call: Call, attempts: Any, op: Op) -> Any:
    """One :data:`~.engine.ops.Op` of the engine that is neither a send nor a store
    step, awaited."""
    if isinstance(op, Sleep):
        return await _asleep(call, op.seconds)
    if isinstance(op, Keep):
        return await attempts.keep(op.response, op.limit, op.seconds)
    if isinstance(op, Close):
        return await attempts.close(op.response)
    if isinstance(op, Follow):
        attempts.follow(op.response, op.retry)  # never asked: httpx follows redirects itself
        return None
    raise TypeError(f"not an operation of the engine: {type(op).__name__}")


async def _finish(step: asyncio.Future[Any]) -> None:
    """Wait for a store step to end, however often the task is cancelled meanwhile."""
    while not step.done():
        try:
            await asyncio.shield(step)
        except asyncio.CancelledError:
            continue
        except Exception:  # its error is the step's: thrown in by the caller's raise
            return


async def _asleep(call: Call, seconds: float) -> bool:
    """``call.sleep`` on the event loop: False when the call's cancel event ended it."""
    cancel = call.terms.cancel
    if cancel is not None and cancel.is_set():
        return False
    if seconds <= 0:
        return True
    asleep = getattr(call.clock, "asleep", None)
    if asleep is not None:
        return bool(await asleep(seconds, cancel))
    await asyncio.sleep(seconds)  # a clock of the caller's with no asleep: the loop's time
    return not (cancel is not None and cancel.is_set())
