"""RetryAfterPoolManager: the engine for plain urllib3, without requests.

A ``urllib3.PoolManager`` whose ``urlopen`` (and so ``request``) runs the engine's loop:
admission before every attempt (the first included, so a shared cooldown and
``budget(resume=...)`` hold back the first request too), exactly one attempt through
``PoolManager.urlopen``, the policy's decision, then a wait or the result. Redirects
are followed here, hop by hop, inside the one deadline.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urljoin, urlsplit

from urllib3 import PoolManager
from urllib3.exceptions import (
    MaxRetryError,
    NewConnectionError,
    ProtocolError,
    ProxyError,
    ResponseError,
    SSLError,
    TimeoutError,
)
from urllib3.util.retry import Retry

from . import _forksafe, _keepalive, body
from .deferral import Deferral
from .deferred import MaxRetryDeferred
from .engine import SINGLE_ATTEMPT, Call, Outcome, run
from .redact import message_url
from .retry import RetryAfterRetry
from .scope import RequestInfo
from .settings import Settings, SharedSettings, as_retry_after_retry, local_429

__all__ = ["RetryAfterPoolManager"]

_ABSENT: Any = object()
_TRANSPORT_ERRORS = (TimeoutError, ProtocolError, SSLError, ProxyError, NewConnectionError)


class _PoolTransport:
    """One attempt through ``PoolManager.urlopen`` (no retry, no redirect followed)."""

    follows_redirects = True

    def __init__(
        self,
        manager: RetryAfterPoolManager,
        method: str,
        url: str,
        redirect: bool,
        kw: dict[str, Any],
        policy: Retry,
    ):
        self.manager = manager
        self.method = method
        self.full_url = url
        self.url = message_url(url)  # what urllib3 counts and logs: no user info, no query
        self.follows_redirects = redirect
        self.kw = kw
        self.user_timeout = kw.pop("timeout", _ABSENT)
        #: Whether the caller wants the body read (urllib3's ``preload_content``): the
        #: final response's is read in full, a retried one's only up to a bound.
        self.preload = kw.pop("preload_content", True)
        self.streams = not self.preload
        self.policy = policy

    def send(self, timeout: Any) -> Any:
        kw = dict(self.kw)
        if timeout is not _ABSENT:
            kw["timeout"] = timeout
        response = PoolManager.urlopen(
            self.manager,
            self.method,
            self.full_url,
            redirect=False,
            retries=SINGLE_ATTEMPT,
            preload_content=False,
            **kw,
        )
        _keepalive.note(response)  # no reuse of a connection idle past its Keep-Alive
        if self.preload and not self._may_retry(response.status):
            # A final answer: read as urllib3 reads it (a broken body is a read error);
            # one that may be retried is read later, and only up to a bound, if retried.
            try:
                response.data  # noqa: B018
            except BaseException:
                response.close()
                raise
        return response

    def _may_retry(self, status: int) -> bool:
        """Whether the policy may retry (or follow, or defer on) this status: its body
        is then read later, bounded, if at all."""
        return 300 <= status < 400 or self.policy.is_retry(self.method, status, True)

    @staticmethod
    def raw(response: Any) -> Any:
        return response

    @staticmethod
    def transport_error(exc: Exception) -> Exception | None:
        cause = exc.reason if isinstance(exc, MaxRetryError) else exc
        return cause if isinstance(cause, _TRANSPORT_ERRORS) else None

    @staticmethod
    def keep(response: Any, limit: int | None, seconds: float | None = None) -> bytes | None:
        """Read the body now (at most ``limit`` bytes, within ``seconds``), keep it as
        ``response.data`` and return it: the connection goes back to its pool, or is
        dropped past a bound or when the body breaks."""
        if response._body is None and not response.closed:
            response._body, _ = body.read_bounded(response, limit, seconds, decode=None)
        response.release_conn()
        data = response._body
        return data if isinstance(data, bytes) else None

    @staticmethod
    def on_done(response: Any, release: Callable[[], None]) -> None:
        body.on_done(response, release)

    @staticmethod
    def close(response: Any) -> None:
        response.close()
        response.release_conn()  # the attempt is over: its slot is given back

    def follow(self, response: Any, retry: Retry) -> None:
        """Point the next attempt at the redirect's target, as ``PoolManager.urlopen``."""
        location = urljoin(self.full_url, response.get_redirect_location())
        headers = dict(self.kw.get("headers") or self.manager.headers or {})
        if response.status == 303 and self.method != "HEAD":
            self.method = "GET"
            self.kw["body"] = None
            headers = {
                k: v for k, v in headers.items() if k.lower() not in ("content-type", "content-length")
            }
        if _origin(location) != _origin(self.full_url):
            remove = {name.lower() for name in retry.remove_headers_on_redirect}
            headers = {k: v for k, v in headers.items() if k.lower() not in remove}
        self.kw["headers"] = headers
        response.drain_conn()
        self.full_url = location
        self.url = message_url(location)


def _origin(url: str) -> tuple[str, str | None, int | None]:
    parts = urlsplit(url)
    return (parts.scheme.lower(), parts.hostname, parts.port)


def _rebuild(kwargs: dict[str, Any]) -> RetryAfterPoolManager:
    return RetryAfterPoolManager(**kwargs)


class RetryAfterPoolManager(SharedSettings, PoolManager):
    """A ``urllib3.PoolManager`` that obeys Retry-After exactly and shares cooldowns.

    - ``retries``: the policy, a :class:`RetryAfterRetry` (or an int, a stock ``Retry``,
      None for the adapter's default); a ``retries=`` given to ``request``/``urlopen``
      replaces it for that call, as in urllib3.
    - ``cooldown``, ``scope``, ``raise_on_defer``, ``store_failure``, ``on_decision``:
      as for :class:`~retry_after_adapter.RetryAfterAdapter`. A scope function receives
      a :class:`~retry_after_adapter.scope.RequestInfo` (``method``, ``url``,
      ``headers``). ``quota``, ``max_concurrency``, ``lease_ttl``, ``max_waiting``,
      ``learn_rate`` and ``replay_unprocessed`` too.

    Every other argument is ``PoolManager``'s. A deferred call returns the last
    response with a ``deferral`` attribute (read it with
    :func:`~retry_after_adapter.deferral_of`), or, deferred before anything was sent,
    a locally built 429; it raises :class:`MaxRetryDeferred` (a ``MaxRetryError``)
    after a transport error, with ``raise_on_defer=True``, and when retries run out
    under ``raise_on_status=True``. Copies and pickles as its configuration.
    """

    def __init__(
        self,
        num_pools: int = 10,
        headers: Mapping[str, str] | None = None,
        *,
        retries: Any = None,
        **kwargs: Any,
    ) -> None:
        """``kwargs``: the shared :class:`~retry_after_adapter.settings.Options`
        (``cooldown``, ``quota``...) and ``PoolManager``'s connection pool keywords."""
        settings = Settings.take(kwargs)
        Settings.refuse_unknown(type(self).__name__, kwargs, None)  # else at the first pool
        super().__init__(num_pools=num_pools, headers=headers, **kwargs)
        self.retries: RetryAfterRetry = as_retry_after_retry(retries)
        self._share(settings)
        #: What a copy is built from, besides the settings (read when it is made).
        self._config: dict[str, Any] = dict(
            num_pools=num_pools, headers=None if headers is None else dict(headers), **kwargs
        )
        _forksafe.register(self)

    def _after_fork(self) -> None:
        """In a forked child: the connections kept alive are the parent's (a child
        reading from one takes the parent's answer, or waits for it): the child gets
        pools of its own, the parent's sockets are left to it (never shut down here)."""
        pools = self.pools
        self.pools = type(pools)(pools._maxsize, dispose_func=pools.dispose_func)

    def __reduce__(self) -> tuple[Any, ...]:
        # Pools hold sockets and locks: a copy or an unpickled manager is a new one
        # with the same configuration (and the same store, for a shallow copy).
        return (_rebuild, ({**self._config, "retries": self.retries, **self.settings.keywords()},))

    def urlopen(self, method: str, url: str, redirect: bool = True, **kw: Any) -> Any:  # type: ignore[override]
        """Open ``url`` under the retry policy; see the class docstring."""
        retries = kw.pop("retries", None)
        policy = self.retries if retries is None else as_retry_after_retry(retries)
        info = RequestInfo(method, url, kw.get("headers") or self.headers or {}, kw.get("body"))
        call = self._call(policy, info)
        transport = _PoolTransport(self, method, url, redirect, kw, policy)
        return self._result(transport, call, run(call, transport))

    #: urllib3 returns a redirect it does not follow, deferred or not.
    defers_redirects = False

    def _failed(
        self, transport: _PoolTransport, error: BaseException, deferral: Deferral | None
    ) -> BaseException:
        if deferral is None:
            return error
        reason = error.reason if isinstance(error, MaxRetryError) else error
        return MaxRetryDeferred(None, transport.url, reason, deferral)  # type: ignore[arg-type]

    def _adopt(self, transport: _PoolTransport, response: Any, outcome: Outcome[Any]) -> Any:
        if transport.preload and response._body is None:
            response.data  # noqa: B018 - preload_content=True: read now, as urllib3 does
        response.deferral = outcome.deferral
        response.stop_reason = outcome.stop_reason
        return response

    def _finished(self, transport: _PoolTransport, call: Call, response: Any, outcome: Outcome[Any]) -> Any:
        if outcome.redirect and outcome.exhausted and call.retry.raise_on_redirect:
            response.drain_conn()
            raise MaxRetryError(None, transport.url, ResponseError("too many redirects"))  # type: ignore[arg-type]
        return response

    def _deferred(
        self,
        transport: _PoolTransport,
        call: Call,
        deferral: Deferral,
        response: Any,
        limit: MaxRetryError | None,
    ) -> MaxRetryDeferred:
        # Out of retries: urllib3's own reason.
        why = limit.reason if limit is not None else ResponseError(f"deferred ({deferral.reason})")
        if response is not None:
            _PoolTransport.keep(response, call.policy.max_retry_body)  # readable, its connection pooled
        return MaxRetryDeferred(None, transport.url, why, deferral, response)

    def _local(self, transport: _PoolTransport, deferral: Deferral) -> Any:
        response = local_429(deferral, transport.method, transport.url)
        if transport.preload:
            response.data  # noqa: B018 - as urllib3 does for preload_content=True
        response.deferral = deferral
        response.stop_reason = None
        response.local = True
        return response
