"""What :class:`~retry_after_adapter.RetryAfterAdapter` (requests) and
:class:`~retry_after_adapter.RetryAfterPoolManager` (urllib3) share: their settings,
checked once, the :class:`~retry_after_adapter.engine.Plan` their calls run on, the
policy an argument stands for, and the 429 built for a call deferred before sending.
"""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from typing import Any

from urllib3.util.retry import Retry

from ._compat import local_response
from .cooldown.base import CooldownStore
from .cooldown.freshness import Freshness
from .cooldown.guard import DEFAULT, check_store_failure, shared
from .cooldown.memory import DEFAULT_STORE
from .deferral import Deferral
from .engine import Call, Plan, current_override
from .engine.buckets import refine_call
from .errors import ConfigurationError
from .observe import DecisionHook, as_hooks
from .quota import Quota
from .retry import RetryAfterRetry
from .scope import RequestInfo, ScopeFunction, resolve_scope

__all__ = [
    "DEFAULT_LEASE_TTL",
    "LOCAL_HEADER",
    "SharedSettings",
    "as_retry_after_retry",
    "default_retry",
    "local_429",
    "local_parts",
]

#: The header that marks a 429 built locally (nothing was sent); its value is the
#: deferral's reason. The response's ``local`` attribute says the same.
LOCAL_HEADER = "X-Local-Deferral"


def local_parts(deferral: Deferral) -> tuple[dict[str, str], bytes]:
    """The headers and body of the 429 built here for a call deferred before sending:
    ``Retry-After`` is the whole seconds left (rounded up), the body the deferral's
    JSON, and the :data:`LOCAL_HEADER` names the reason."""
    headers = {
        "Retry-After": str(max(0, math.ceil(deferral.delay))),
        "Content-Type": "application/json",
        LOCAL_HEADER: str(deferral.reason),
    }
    return headers, json.dumps(deferral.to_dict()).encode("ascii")


def local_429(deferral: Deferral, method: str | None, url: str | None) -> Any:
    """A urllib3 429 built here for a call deferred before sending (see
    :func:`local_parts`)."""
    headers, body = local_parts(deferral)
    return local_response(
        status=429, reason="Too Many Requests", headers=headers, body=body, method=method, url=url
    )


def default_retry() -> RetryAfterRetry:
    """The policy an adapter uses when given none: 5 retries, backoff 0.5 s, max_wait
    60 s, and the last response returned (not raised) when retries run out."""
    return RetryAfterRetry(total=5, backoff_factor=0.5, raise_on_status=False)


def as_retry_after_retry(max_retries: Any) -> RetryAfterRetry:
    """Turn an adapter's ``max_retries`` argument into a :class:`RetryAfterRetry`.

    None gives :func:`default_retry`; an int ``n`` gives ``RetryAfterRetry(n,
    raise_on_status=False)`` (so, as ``HTTPAdapter(max_retries=n)``, the last response
    is returned); a stock urllib3 ``Retry`` is copied with all its settings.
    """
    from ._compat import retry_arguments

    if max_retries is None:
        return default_retry()
    if isinstance(max_retries, RetryAfterRetry):
        return max_retries
    if isinstance(max_retries, Retry):
        return RetryAfterRetry(**retry_arguments(max_retries))
    if isinstance(max_retries, int) and not isinstance(max_retries, bool) and max_retries >= 0:
        return RetryAfterRetry(max_retries, raise_on_status=False)
    raise ConfigurationError("max_retries must be a RetryAfterRetry, a urllib3 Retry, an int >= 0 or None")


#: Seconds a concurrency slot is held at most when its worker never gives it back.
DEFAULT_LEASE_TTL = 60.0


def _check_quota(quota: object, store: object) -> Quota | None:
    if quota is None:
        return None
    if not isinstance(quota, Quota):
        raise ConfigurationError("quota must be a Quota(limit, per=seconds) or None")
    if store is None:
        raise ConfigurationError("a quota is shared through a store: cooldown= must not be None")
    return quota


def _check_count(name: str, value: object, least: int) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < least):
        raise ConfigurationError(f"{name} must be an int >= {least} or None")
    return value


def _check_ttl(value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (math.isfinite(value) and value > 0)
    ):
        raise ConfigurationError("lease_ttl must be a finite number of seconds > 0")
    return float(value)


class SharedSettings:
    """What :class:`RetryAfterAdapter` and :class:`~retry_after_adapter.RetryAfterPoolManager`
    share: the cooldown store and its failure policy, the scope, ``raise_on_defer``, the
    ``on_decision`` hooks, the quota, the concurrency cap, and the plan every call of
    the owner runs on (built once, again after a copy or an unpickling)."""

    cooldown: CooldownStore | None
    scope: str | ScopeFunction
    raise_on_defer: bool
    store_failure: str
    on_decision: tuple[DecisionHook, ...]
    quota: Quota | None = None
    max_concurrency: int | None = None
    lease_ttl: float = DEFAULT_LEASE_TTL
    max_waiting: int | None = None
    learn_rate: bool = True

    def _share(
        self,
        cooldown: CooldownStore | None,
        scope: str | ScopeFunction | None,
        raise_on_defer: bool,
        store_failure: str,
        on_decision: DecisionHook | Collection[DecisionHook] | None,
        quota: Quota | None = None,
        max_concurrency: int | None = None,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        max_waiting: int | None = None,
        learn_rate: bool = True,
    ) -> None:
        self.on_decision = as_hooks(on_decision)
        self.store_failure = check_store_failure(store_failure)
        self.cooldown = DEFAULT_STORE if cooldown is DEFAULT else cooldown
        self.scope = "origin" if scope is None else scope
        self.raise_on_defer = bool(raise_on_defer)
        self.quota = _check_quota(quota, self.cooldown)
        self.max_concurrency = _check_count("max_concurrency", max_concurrency, 1)
        if self.max_concurrency is not None and self.cooldown is None:
            raise ConfigurationError("max_concurrency is shared through a store: cooldown= must not be None")
        self.lease_ttl = _check_ttl(lease_ttl)
        self.max_waiting = _check_count("max_waiting", max_waiting, 0)
        if not isinstance(learn_rate, bool):
            raise ConfigurationError("learn_rate must be True or False")
        self.learn_rate = learn_rate
        self._derive()

    def _derive(self) -> None:
        """Derive what is not kept when the owner is copied or pickled: the plan."""
        store = shared(self.cooldown)
        if store is not None and self.quota is not None and not store.supports("quota"):
            raise ConfigurationError(
                f"a quota needs a store that can take permits (acquire()); {type(self.cooldown).__name__} "
                "cannot: use MemoryCooldownStore, SQLiteCooldownStore or RedisCooldownStore"
            )
        if store is not None and self.max_concurrency is not None and not store.supports("leases"):
            raise ConfigurationError(
                "max_concurrency needs a store that holds leases (lease() and release()): "
                "MemoryCooldownStore, SQLiteCooldownStore or RedisCooldownStore"
            )
        self._plan = Plan(
            store,
            fail_closed=self.store_failure == "closed",
            quota=self.quota,
            slots=self.max_concurrency,
            ttl=self.lease_ttl,
            max_waiting=self.max_waiting,
            learn_rate=self.learn_rate,
        )
        self._scope_fn = resolve_scope(self.scope)

    def freshness(self, target: str) -> Freshness | None:
        """The freshness of a scope, or of the scope of a URL (``target`` with ``://``,
        scoped as a GET of it would be): its last success, last error class and next
        eligible time, as every worker sharing the store noted them (None: nothing
        known, or no store)."""
        store = self._plan.store
        if store is None or not store.supports("freshness"):
            return None
        scope = self._scope_fn(RequestInfo("GET", target, {})) if "://" in target else target
        return store.freshness(scope)

    def _call(self, policy: RetryAfterRetry, request: Any) -> Call:
        """A new call of ``request`` under ``policy`` and the enclosing ``budget()``
        (scoped by its route's bucket once the route reported one)."""
        call = Call(
            policy,
            self._plan,
            scope=self._scope_fn(request),
            hooks=self.on_decision,
            override=current_override(),
        )
        if self._plan.dialects.routes:
            refine_call(call, request.method, request.url)
        return call
