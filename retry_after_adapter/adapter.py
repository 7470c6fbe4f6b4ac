"""RetryAfterAdapter: a requests transport adapter that defers instead of shortening.

Mount it on a ``requests.Session``; it binds a per-call budget that the
:class:`RetryAfterRetry` reads, checks the shared cooldown before the first attempt,
and returns every response with ``.deferral`` (``None`` unless the call was deferred).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Mapping
from contextlib import suppress
from functools import lru_cache
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from ._call import CURRENT, CallState, Halt, wait_out
from ._compat import BudgetTimeout, retry_arguments
from .cooldown.base import CooldownStore
from .cooldown.guard import GuardedStore
from .cooldown.memory import DEFAULT_STORE, MemoryCooldownStore
from .errors import ConfigurationError, CooldownUnavailable, InvalidRetryAfter, RetryDeferred
from .policy import DEFER, decide
from .retry import COOLDOWN_STATUSES, DecisionHook, RetryAfterRetry, as_hooks

_DEFAULT: Any = object()
_DEFAULT_PORTS = {"http": 80, "https": 443}
_SECRET_HEADERS = ("Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key", "Api-Key")
ScopeFunction = Callable[[requests.PreparedRequest], str]


def default_retry() -> RetryAfterRetry:
    """The policy an adapter uses when given none: 5 retries, backoff 0.5 s, max_wait 60 s."""
    return RetryAfterRetry(total=5, backoff_factor=0.5)


def as_retry_after_retry(max_retries: Any) -> RetryAfterRetry:
    """Turn an adapter's ``max_retries`` argument into a :class:`RetryAfterRetry`.

    None gives :func:`default_retry`; an int ``n`` gives ``RetryAfterRetry(n)``; a stock
    urllib3 ``Retry`` is copied with all its settings.
    """
    if max_retries is None:
        return default_retry()
    if isinstance(max_retries, RetryAfterRetry):
        return max_retries
    if isinstance(max_retries, Retry):
        return RetryAfterRetry(**retry_arguments(max_retries))
    if isinstance(max_retries, int) and not isinstance(max_retries, bool) and max_retries >= 0:
        return RetryAfterRetry.from_int(max_retries)  # type: ignore[return-value]
    raise ConfigurationError("max_retries must be a RetryAfterRetry, a urllib3 Retry, an int >= 0 or None")


@lru_cache(maxsize=1024)
def _origin(scheme: str, netloc: str) -> str:
    parts = urlsplit(f"{scheme}://{netloc}")
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        port = _DEFAULT_PORTS.get(scheme.lower(), 0)
    return f"{scheme.lower()}://{host}:{port}"


def origin_scope(request: requests.PreparedRequest) -> str:
    """The default scope: the request's origin as ``scheme://host:port``.

    Any user info (``user:password@``) and the path and query are left out.
    """
    url = request.url or ""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigurationError("cannot derive a cooldown scope from a URL without a scheme")
    netloc = rest.split("/", 1)[0].split("?", 1)[0].split("#", 1)[0]
    return _origin(scheme, netloc)


def hash_scope(text: str) -> str:
    """A stable, non-reversible scope key for a credential-derived value."""
    return "sha256:" + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def credential_scope(request: requests.PreparedRequest) -> str:
    """Origin plus a hash of the request's credential (Authorization, or API key header).

    For providers whose quota is per account or per credential.
    """
    origin = origin_scope(request)
    headers = request.headers
    for name in _SECRET_HEADERS:
        value = headers.get(name)
        if value:
            return f"{origin}|{hash_scope(name.lower() + ':' + value)}"
    return origin


def _secrets_of(request: requests.PreparedRequest) -> list[str]:
    found = [str(v) for name in _SECRET_HEADERS if (v := request.headers.get(name))]
    url = request.url or ""
    if "?" in url:
        query = url.split("?", 1)[1].split("#", 1)[0]
        found.extend(part.split("=", 1)[1] for part in query.split("&") if "=" in part)
    netloc = url.partition("://")[2].split("/", 1)[0]
    if "@" in netloc:
        found.append(netloc.rsplit("@", 1)[0])
    return [s for s in found if len(s) >= 4]


def _safe_scope(value: object, request: requests.PreparedRequest) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigurationError("a scope function must return a non-empty string")
    if len(value) > 256 or any(secret in value for secret in _secrets_of(request)):
        return hash_scope(value)
    return value


_NAMED_SCOPES: Mapping[str, ScopeFunction] = {"origin": origin_scope, "credential": credential_scope}


class RetryAfterAdapter(HTTPAdapter):
    """An ``HTTPAdapter`` that obeys Retry-After exactly and shares cooldowns.

    - ``max_retries``: a :class:`RetryAfterRetry` (or an int, a stock ``Retry``, None).
    - ``cooldown``: a :class:`CooldownStore` shared by every worker of a quota. By
      default one process-wide memory store shared by every adapter not given its
      own; ``None`` disables sharing.
    - ``scope``: ``"origin"`` (default: scheme, host and port), ``"credential"`` (origin
      plus a hash of the credential), or ``callable(request) -> str``. A returned
      scope that contains a credential or a query value is hashed before use.
    - ``raise_on_defer``: raise :class:`RetryDeferred` instead of returning the
      response with ``.deferral`` set.
    - ``store_failure``: ``"open"`` (default: requests go on, cooldowns kept in this
      process while the store is down) or ``"closed"`` (defer with reason
      ``"cooldown-unknown"`` while the store is down).
    - ``on_decision``: callable(s) receiving every decision as a ``DecisionRecord``,
      in addition to the Retry object's own hooks.

    Every other argument is ``HTTPAdapter``'s (``pool_connections``, ``pool_maxsize``,
    ``pool_block``).
    """

    def __init__(
        self,
        max_retries: Any = None,
        *,
        cooldown: CooldownStore | None = _DEFAULT,
        scope: str | ScopeFunction | None = None,
        raise_on_defer: bool = False,
        store_failure: str = "open",
        on_decision: DecisionHook | Collection[DecisionHook] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.on_decision = as_hooks(on_decision)
        self.max_retries: RetryAfterRetry = as_retry_after_retry(max_retries)
        if store_failure not in ("open", "closed"):
            raise ConfigurationError("store_failure must be 'open' or 'closed'")
        if cooldown is _DEFAULT:
            cooldown = DEFAULT_STORE
        if cooldown is not None and not isinstance(cooldown, CooldownStore):
            raise ConfigurationError("cooldown must be a CooldownStore (get and extend) or None")
        self.cooldown = cooldown
        if cooldown is None or (isinstance(cooldown, MemoryCooldownStore) and store_failure == "open"):
            self._store: CooldownStore | None = cooldown
        else:
            self._store = GuardedStore(cooldown, fail_closed=store_failure == "closed")
        self.store_failure = store_failure
        if scope is None:
            scope = "origin"
        if isinstance(scope, str):
            if scope not in _NAMED_SCOPES:
                raise ConfigurationError("scope must be 'origin', 'credential' or a callable")
            self._scope_fn: ScopeFunction = _NAMED_SCOPES[scope]
            self._scope_checked = False
        elif callable(scope):
            self._scope_fn = scope
            self._scope_checked = True
        else:
            raise ConfigurationError("scope must be 'origin', 'credential' or a callable")
        self.scope = scope
        self.raise_on_defer = bool(raise_on_defer)

    def scope_for(self, request: requests.PreparedRequest) -> str:
        """The cooldown scope of ``request`` (never a credential in clear)."""
        value = self._scope_fn(request)
        return _safe_scope(value, request) if self._scope_checked else value

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
        retry = self.max_retries
        call = retry.call_state(
            scope=self.scope_for(request), store=self._store, adapter_mode=True, on_decision=self.on_decision
        )
        token = CURRENT.set(call)
        try:
            try:
                self._admit(call)
                if call.deadline is not None:
                    timeout = BudgetTimeout(timeout, call.remaining)
                response = super().send(
                    request, stream=stream, timeout=timeout, verify=verify, cert=cert, proxies=proxies
                )
                if response.is_redirect and "Retry-After" in response.headers:
                    self._wait_before_redirect(call, response)
            except Halt as halt:
                return self._halted(request, halt)
            self._record_final(call, response)
            response.deferral = None  # type: ignore[attr-defined]
            response.stop_reason = None  # type: ignore[attr-defined]
            return response
        finally:
            CURRENT.reset(token)

    def _admit(self, call: CallState) -> None:
        """Before the first attempt: wait out a fitting cooldown, or defer without sending.

        The common case, no cooldown stored, costs one store read and no waiting logic.
        """
        if call.resume_at is None and call.cancel is None:
            if call.store is None or call.scope is None:
                return
            try:
                until = call.store.get(call.scope)
            except CooldownUnavailable:
                pass  # wait_out reads again and applies the failure policy
            else:
                if until is None or until <= call.clock.now():
                    return
        wait_out(call, call.clock.monotonic(), None)

    def _wait_before_redirect(self, call: CallState, response: requests.Response) -> None:
        """requests follows redirects itself, calling ``send`` again at once: a 3xx's
        Retry-After is waited out here if it fits the budget, else the call is deferred.
        """
        try:
            parsed = call.read_hint(response.headers["Retry-After"], response.headers.get("Date"))
        except InvalidRetryAfter:
            return  # an invalid hint on a redirect: follow it as requests would
        if parsed.delay <= 0:
            return
        decision = decide(
            server_delay=parsed.delay,
            backoff=0.0,
            cooldown_left=0.0,
            jitter=0.0,
            elapsed=call.elapsed(),
            deadline=call.deadline,
            max_wait=call.max_wait,
            attempt_reserve=call.attempt_reserve,
        )
        call.last_status = response.status_code
        if decision.action == DEFER:
            raise call.defer(decision, response.raw, parsed.delay)
        call.emit(decision, parsed.delay)
        wait_out(call, call.clock.monotonic() + decision.wait, response.raw)

    def _halted(self, request: requests.PreparedRequest, halt: Halt) -> requests.Response:
        deferral = halt.deferral
        if halt.response is None:
            assert deferral is not None
            raise RetryDeferred(deferral, response=None, request=request) from None
        response = self.build_response(request, halt.response)
        response.deferral = deferral  # type: ignore[attr-defined]
        response.stop_reason = halt.stop_reason  # type: ignore[attr-defined]
        # A deferred redirect is raised, not returned: requests would follow it at once.
        if deferral is not None and (self.raise_on_defer or response.is_redirect):
            raise RetryDeferred(deferral, response=response, request=request) from None
        return response

    def _record_final(self, call: CallState, response: requests.Response) -> None:
        """A response that was not retried (a POST's 429, say) still sets the cooldown."""
        if response.status_code not in COOLDOWN_STATUSES or call.recorded is response.raw:
            return
        raw = response.headers.get("Retry-After")
        if raw is None or call.store is None or call.scope is None:
            return
        try:
            parsed = call.read_hint(raw, response.headers.get("Date"))
        except InvalidRetryAfter:
            return
        with suppress(CooldownUnavailable):  # GuardedStore.extend never raises; others may
            call.extend_cooldown(parsed.eligible_at)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(max_retries={self.max_retries!r}, "
            f"cooldown={type(self.cooldown).__name__ if self.cooldown is not None else None})"
        )


__all__ = ["DEFAULT_STORE", "RetryAfterAdapter", "credential_scope", "hash_scope", "origin_scope"]
