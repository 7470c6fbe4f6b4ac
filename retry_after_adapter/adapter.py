"""RetryAfterAdapter: a requests transport adapter that defers instead of shortening.

Mount it on a ``requests.Session``. Each ``send`` runs the engine's loop
(:func:`retry_after_adapter.engine.run`): admission before every attempt, exactly one
attempt through ``HTTPAdapter.send`` (urllib3 itself never retries), the policy's
decision, then a wait or the result. Every response it returns is a
:class:`RetryAfterResponse`, whose ``deferral`` is None unless the call was deferred.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from typing_extensions import Unpack

import requests
from requests.adapters import HTTPAdapter
from urllib3.exceptions import HTTPError, MaxRetryError
from urllib3.util.retry import Retry

from . import _forksafe, _keepalive, body
from .cooldown.memory import DEFAULT_STORE
from .deferral import Deferral
from .deferred import RetryDeferred
from .engine import SINGLE_ATTEMPT, Call, Outcome, run
from .policy import Reason
from .redact import message_url
from .retry import RetryAfterRetry
from .scope import credential_scope, hash_scope, origin_scope
from .settings import (
    DEFAULT_LEASE_TTL,
    LOCAL_HEADER,
    Options,
    Settings,
    SharedSettings,
    as_retry_after_retry,
    default_retry,
    local_429,
    store_name,
)

__all__ = [
    "DEFAULT_LEASE_TTL",
    "DEFAULT_STORE",
    "LOCAL_HEADER",
    "RetryAfterAdapter",
    "RetryAfterResponse",
    "as_retry_after_retry",
    "credential_scope",
    "default_retry",
    "hash_scope",
    "local_429",
    "origin_scope",
]

#: Where a call's state waits in ``PreparedRequest.hooks`` between redirect hops:
#: requests copies a request for each hop and the copy keeps the same hooks dict.
_CALL_KEY = "retry_after_adapter.call"
#: What requests' ``HTTPAdapter`` takes besides ``max_retries``.
_HTTP_ADAPTER_KEYWORDS = ("max_retries", "pool_connections", "pool_maxsize", "pool_block")


class RetryAfterResponse(requests.Response):
    """The ``requests.Response`` that :class:`RetryAfterAdapter` returns.

    - ``deferral``: the :class:`Deferral` when the call was deferred, else None.
    - ``stop_reason``: why the policy stopped retrying (``Reason.INVALID_RETRY_AFTER``),
      else None.
    - ``local``: True for a 429 built locally because the call was deferred before
      anything was sent (its ``Retry-After`` is the whole seconds left, and it carries
      the :data:`LOCAL_HEADER`); False for a response from the server.

    ``session.get()`` is typed as returning ``requests.Response``: narrow it with
    ``isinstance(response, RetryAfterResponse)``, or use
    :func:`~retry_after_adapter.deferral_of`, which takes any response.
    """

    deferral: Deferral | None = None
    stop_reason: Reason | None = None
    local: bool = False

    @classmethod
    def adopt(cls, response: requests.Response) -> RetryAfterResponse:
        """``response`` itself, now of this class (no copy: its body stays unread)."""
        if not isinstance(response, cls):
            response.__class__ = cls
        assert isinstance(response, cls)
        return response


_VIEW_CLASSES: dict[type[HTTPAdapter], type[HTTPAdapter]] = {}


def _view_class(cls: type[HTTPAdapter]) -> type[HTTPAdapter]:
    """A subclass of ``cls`` whose ``max_retries`` is one attempt, whatever the
    instance holds: ``HTTPAdapter.send`` hands ``self.max_retries`` to urllib3, and
    urllib3 must not loop under the engine."""
    view = _VIEW_CLASSES.get(cls)
    if view is None:
        view = type(
            f"{cls.__name__}Attempt",
            (cls,),
            {"max_retries": property(lambda self: SINGLE_ATTEMPT), "__module__": __name__},
        )
        _VIEW_CLASSES[cls] = view
    return view


class _RequestsTransport:
    """One attempt through ``HTTPAdapter.send`` on the adapter's one-attempt view."""

    follows_redirects = False
    __slots__ = (
        "cert", "method", "proxies", "request", "stream", "streams", "url", "user_timeout", "verify", "view"
    )

    def __init__(
        self,
        view: HTTPAdapter,
        request: requests.PreparedRequest,
        stream: bool,
        timeout: Any,
        verify: bool | str,
        cert: Any,
        proxies: Mapping[str, str] | None,
    ) -> None:
        self.view = view
        self.request = request
        self.stream = stream
        self.streams = bool(stream)
        self.user_timeout = timeout
        self.verify = verify
        self.cert = cert
        self.proxies = proxies
        self.method = request.method or "GET"
        url = request.url or ""
        self.url: str = message_url(url)  # what urllib3 counts and logs: no user info, no query

    def send(self, timeout: Any) -> requests.Response:
        response = HTTPAdapter.send(
            self.view,
            self.request,
            stream=self.stream,
            timeout=timeout,
            verify=self.verify,
            cert=self.cert,
            proxies=cast(Any, self.proxies),
        )
        _keepalive.note(response.raw)  # no reuse of a connection idle past its Keep-Alive
        return response

    @staticmethod
    def raw(response: requests.Response) -> Any:
        return response.raw

    @staticmethod
    def transport_error(exc: Exception) -> Exception | None:
        """The urllib3 failure behind what ``HTTPAdapter.send`` raised, or None when it
        carries none (a ConnectionError raised by a mock such as ``responses`` for an
        unmatched URL, say): that cannot heal, and propagates unchanged."""
        if not isinstance(exc, (requests.exceptions.ConnectionError, requests.exceptions.Timeout)):
            return None
        inner = exc.args[0] if exc.args else None
        if isinstance(inner, MaxRetryError):
            inner = inner.reason
        return inner if isinstance(inner, (HTTPError, OSError)) else None

    @staticmethod
    def keep(response: requests.Response, limit: int | None, seconds: float | None = None) -> bytes | None:
        """Read the body now (at most ``limit`` bytes, within ``seconds``) and return it:
        the connection goes back to its pool, or is dropped past a bound or when the
        body breaks."""
        unread: Any = response  # requests' own (untyped) state of its body
        if not unread._content_consumed and response.raw is not None:
            unread._content, _ = body.read_bounded(response.raw, limit, seconds)
            unread._content_consumed = True
        content = unread._content
        return content if isinstance(content, bytes) else None

    @staticmethod
    def on_done(response: requests.Response, release: Callable[[], None]) -> None:
        body.on_done(response.raw, release)

    @staticmethod
    def close(response: requests.Response) -> None:
        response.close()

    def follow(self, response: requests.Response, retry: Retry) -> None:  # pragma: no cover
        raise AssertionError("requests follows redirects itself")


class AdapterOptions(Options, total=False):
    """:class:`RetryAfterAdapter`'s keywords: the shared :class:`Options` and
    ``HTTPAdapter``'s own."""

    pool_connections: int
    pool_maxsize: int
    pool_block: bool


class RetryAfterAdapter(SharedSettings, HTTPAdapter):
    """An ``HTTPAdapter`` that obeys Retry-After exactly and shares cooldowns.

    - ``max_retries``: a :class:`RetryAfterRetry` (or an int, a stock ``Retry``, None).
    - ``cooldown``: a :class:`CooldownStore` shared by every worker of a quota. By
      default one process-wide memory store shared by every adapter not given its
      own; ``None`` disables sharing.
    - ``scope``: ``"origin"`` (default: scheme, host and port), ``"credential"`` (origin
      plus a hash of the credential), or ``callable(request) -> str``. A returned
      scope that contains a credential or a query value is hashed before use.
    - ``raise_on_defer``: raise :class:`RetryDeferred` instead of returning a response
      with ``.deferral`` set.
    - ``store_failure``: ``"open"`` (default: requests go on, cooldowns kept in this
      process while the store is down) or ``"closed"`` (defer with reason
      ``"cooldown-unknown"`` while the store is down).
    - ``on_decision``: callable(s) receiving every decision as a ``DecisionRecord``,
      in addition to the policy's own hooks.
    - ``quota``: a :class:`Quota` (``Quota(100, per=1)``): at most that many requests
      sent in any interval of that many seconds per scope, by every worker sharing the
      store; a permit is taken before each attempt, retries included, and a call that
      cannot get one within its budget defers with reason ``"quota"``.

    - ``max_concurrency``: at most this many attempts of a scope on the wire at once,
      across every worker sharing the store; a slot is a lease of ``lease_ttl`` seconds
      (default 60), given back when the attempt ends, so a killed worker's slot comes
      back by itself. No slot within the budget: defer with reason ``"concurrency"``.
    - ``max_waiting``: at most this many calls of a scope wait (for a cooldown, a
      permit or a slot) in this process; the next one defers at once with the reason
      it would have waited for, instead of tying up a worker.
    - ``learn_rate``: with no ``quota`` and no quota headers from the server, admit
      each scope by the send rate the store learns from its answers, shared by every
      worker (default True; see docs/quotas.md, "A rate nobody announced"). False: off.
    - ``replay_unprocessed``: True sends a request the policy does not replay (a POST)
      again after a 429 whose provider documents it as not processed (OpenAI's,
      Anthropic's), once the wait has passed, when it fits the budget and the body is
      held whole (not a file or a generator). Default off here: urllib3's rule stands
      (the httpx transports, which the SDKs run on, default to on).

    Every other argument is ``HTTPAdapter``'s (``pool_connections``, ``pool_maxsize``,
    ``pool_block``). The adapter copies, deep-copies and pickles (the default store
    maps back to itself, SQLite to its path, Redis to its URL).
    """

    __attrs__ = [*HTTPAdapter.__attrs__, "settings"]

    def __init__(self, max_retries: Any = None, **kwargs: Unpack[AdapterOptions]) -> None:
        keywords: dict[str, Any] = dict(kwargs)
        settings = Settings.take(keywords)
        Settings.refuse_unknown(type(self).__name__, keywords, _HTTP_ADAPTER_KEYWORDS)
        super().__init__(**keywords)
        self.max_retries: RetryAfterRetry = as_retry_after_retry(max_retries)
        self._share(settings)
        _forksafe.register(self)

    def _after_fork(self) -> None:
        """In a forked child: the connections kept alive are the parent's (a child
        reading from one takes the parent's answer, or waits for it): the child gets
        pools of its own, the parent's sockets are left to it (never shut down here)."""
        sizes = cast(Any, self)  # HTTPAdapter's own attributes (untyped in types-requests)
        self.init_poolmanager(sizes._pool_connections, sizes._pool_maxsize, block=sizes._pool_block)
        self.proxy_manager = {}

    def _published(self) -> None:
        self._view: HTTPAdapter | None = None  # made again, for the new plan

    def __setstate__(self, state: dict[str, Any]) -> None:
        if "settings" not in state:  # pickled by 0.9 or before: the options one by one
            state = dict(state)
            state["settings"] = Settings.take(state)
        super().__setstate__(state)  # type: ignore[misc, unused-ignore]  # untyped in types-requests
        self._derive()
        _forksafe.register(self)

    def scope_for(self, request: requests.PreparedRequest) -> str:
        """The cooldown scope of ``request`` (never a credential in clear)."""
        return self._scope_fn(request)

    def _attempt_view(self) -> HTTPAdapter:
        view = self._view
        if view is None:
            view = object.__new__(_view_class(type(self)))
            view.__dict__ = self.__dict__  # the same adapter, seen with one attempt
            self._view = view
        return view

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: bool | str = True,
        cert: Any = None,
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        """Send ``request`` under the retry policy; see the class docstring."""
        hooks = request.hooks
        call = self._continued(request) if hooks and _CALL_KEY in hooks else None
        if call is None:
            call = self._call(self.max_retries, request)
        transport = _RequestsTransport(
            self._view or self._attempt_view(), request, stream, timeout, verify, cert, proxies
        )
        result: RetryAfterResponse = self._result(request, call, run(call, transport))
        return result

    def _continued(self, request: requests.PreparedRequest) -> Call | None:
        """The call this request continues (a redirect hop of it), or None."""
        hooks: Any = request.hooks  # requests' hook lists, and the call this request continues
        entry = hooks.pop(_CALL_KEY, None)
        if entry is None or entry[1] is request:
            return None
        call: Call = entry[0]
        call.continue_on(self._plan, self._scope_fn(request))
        return call

    def _failed(
        self, request: requests.PreparedRequest, error: BaseException, deferral: Deferral | None
    ) -> BaseException:
        if deferral is not None and isinstance(error, requests.exceptions.RequestException):
            return RetryDeferred.keeping(error, deferral)
        return error

    def _adopt(
        self, request: requests.PreparedRequest, received: requests.Response, outcome: Outcome[Any]
    ) -> RetryAfterResponse:
        if not isinstance(received, RetryAfterResponse):
            received.__class__ = RetryAfterResponse  # RetryAfterResponse.adopt(), one call less
        response: RetryAfterResponse = received  # type: ignore[assignment]
        # The adapter, not its one-attempt view: requests' auth handlers (digest) send
        # their follow-up through response.connection, and that must run the engine too.
        response.connection = self
        if outcome.deferral is not None:
            response.deferral = outcome.deferral
        if outcome.stop_reason is not None:
            response.stop_reason = outcome.stop_reason
        return response

    def _finished(
        self, request: requests.PreparedRequest, call: Call, response: Any, outcome: Outcome[Any]
    ) -> RetryAfterResponse:
        if outcome.redirect and isinstance(request.hooks, dict):
            hooks: Any = request.hooks
            hooks[_CALL_KEY] = (call, request)  # the next hop continues this call
        return cast(RetryAfterResponse, response)

    def _deferred(
        self,
        request: requests.PreparedRequest,
        call: Call,
        deferral: Deferral,
        response: Any,
        limit: MaxRetryError | None,
    ) -> RetryDeferred:
        if response is not None:  # its body stays readable (up to the bound), its connection pooled
            _RequestsTransport.keep(response, call.policy.max_retry_body)
        reason = limit.reason if limit is not None else None
        return RetryDeferred(deferral, response=response, request=request, reason=reason)

    def _local(self, request: requests.PreparedRequest, deferral: Deferral) -> RetryAfterResponse:
        """The 429 for a call deferred before anything was sent (no byte went out)."""
        raw = local_429(deferral, request.method, request.url)
        response = RetryAfterResponse.adopt(self.build_response(request, raw))
        response.deferral = deferral
        response.local = True
        return response

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_retries={self.max_retries!r}, "
            f"cooldown={store_name(self.settings.cooldown)})"
        )
