"""What :class:`~retry_after_adapter.RetryAfterAdapter` (requests) and
:class:`~retry_after_adapter.RetryAfterPoolManager` (urllib3) share: their settings,
checked once, the :class:`~retry_after_adapter.engine.Plan` their calls run on, the
policy an argument stands for, and the 429 built for a call deferred before sending.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Collection
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any, TypedDict

from urllib3.exceptions import MaxRetryError
from urllib3.util.retry import Retry

from . import _forksafe
from ._compat import local_response
from .cooldown.base import CooldownStore, FreshnessLog, Leases, QuotaLogs, Weights
from .cooldown.freshness import Freshness
from .cooldown.guard import DEFAULT, check_store_failure, shared
from .cooldown.memory import DEFAULT_STORE
from .cooldown.weights import token_quota
from .cost import FIXED, CostFunction, check_cost_option, cost_error, cost_of
from .deferral import Deferral
from .dialects import GEMINI_MARK, google_client, google_status
from .engine import Call, Outcome, Plan, current_override, refine_call, refine_gemini
from .errors import ConfigurationError, close_keyword, unknown_keyword
from .observe import DecisionHook, as_hooks
from .quota import Quota
from .retry import RetryAfterRetry
from .scope import RequestInfo, ScopeFunction, resolve_scope

__all__ = [
    "DEFAULT_LEASE_TTL",
    "LOCAL_HEADER",
    "Options",
    "Settings",
    "SharedSettings",
    "as_retry_after_retry",
    "default_retry",
    "local_429",
    "local_parts",
    "store_name",
]

#: The header that marks a 429 built locally (nothing was sent); its value is the
#: deferral's reason. The response's ``local`` attribute says the same.
LOCAL_HEADER = "X-Local-Deferral"


def local_parts(deferral: Deferral) -> tuple[dict[str, str], bytes]:
    """The headers and body of the 429 built here for a call deferred before sending:
    ``Retry-After`` is the whole seconds left (rounded up), the body the deferral's
    JSON, and the :data:`LOCAL_HEADER` names the reason. For a deferral of a Gemini
    model's scope the body is ``{"error": <google.rpc.Status>, "deferral": <its JSON>}``
    (``dialects.google_status``: a ``RetryInfo`` never shorter than the wait), as
    Google's clients read an error."""
    headers = {
        "Retry-After": str(max(0, math.ceil(deferral.delay))),
        "Content-Type": "application/json",
        LOCAL_HEADER: str(deferral.reason),
    }
    data: dict[str, Any] = deferral.to_dict()
    if deferral.scope is not None and GEMINI_MARK in deferral.scope:
        # Google's clients (the GenAI SDK) read a google.rpc.Status from the top of the
        # body: what they raise then says RESOURCE_EXHAUSTED, why and when; the
        # deferral's JSON is its "deferral" member.
        message = (
            f"deferred before sending ({deferral.reason}): nothing was sent; "
            f"eligible at {data['eligible_at']}, in {deferral.delay:.3f} s"
        )
        data = {"error": google_status(deferral.delay, message), "deferral": data}
    return headers, json.dumps(data).encode("ascii")


def store_name(store: object) -> str | None:
    """The name of a store's type for a ``repr`` (None for no store)."""
    return type(store).__name__ if store is not None else None


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


def _check_quota(quota: object, store: object) -> Quota | tuple[Quota, ...] | None:
    """A Quota, or a tuple of them (one of each unit, requests first), or None."""
    if quota is None:
        return None
    several = isinstance(quota, (tuple, list))
    given: tuple[object, ...] = tuple(quota) if isinstance(quota, (tuple, list)) else (quota,)
    quotas = tuple(each for each in given if isinstance(each, Quota))
    if not quotas or len(quotas) != len(given):
        raise ConfigurationError(
            "quota must be a Quota(limit, per=seconds), a Quota of each unit in a tuple "
            "(Quota(60, per=60), Quota(90_000, per=60, unit='tokens')), or None"
        )
    units = [each.unit for each in quotas]
    if len(set(units)) != len(units):
        raise ConfigurationError("quota takes at most one Quota of each unit (requests, tokens)")
    if store is None:
        raise ConfigurationError("a quota is shared through a store: cooldown= must not be None")
    if not several:
        return quotas[0]
    return tuple(sorted(quotas, key=lambda each: each.unit != "requests"))


def quota_of(quota: Quota | tuple[Quota, ...] | None, unit: str) -> Quota | None:
    """The quota of ``unit`` among the checked ``quota`` option, or None."""
    quotas = quota if isinstance(quota, tuple) else (quota,) if quota is not None else ()
    return next((each for each in quotas if each.unit == unit), None)


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


class Options(TypedDict, total=False):
    """The keywords every front end takes besides its library's own, as the caller
    gives them (see :class:`Settings` for what each means once checked)."""

    cooldown: CooldownStore | None
    scope: str | ScopeFunction | None
    raise_on_defer: bool
    store_failure: str
    on_decision: DecisionHook | Collection[DecisionHook] | None
    quota: Quota | tuple[Quota, ...] | None
    max_concurrency: int | None
    lease_ttl: float
    max_waiting: int | None
    learn_rate: bool
    cost: int | CostFunction | None
    replay_unprocessed: bool | None


@dataclass(frozen=True)
class Settings:
    """The options of a front end (:class:`RetryAfterAdapter`,
    :class:`~retry_after_adapter.RetryAfterPoolManager`, the httpx transports), checked
    once when it is built; every field is as :class:`Options` takes it, normalised:

    - ``cooldown``: the store shared by every worker of a quota (``DEFAULT``: the
      process-wide memory store; None: no sharing);
    - ``scope``: ``"origin"``, ``"credential"`` or ``callable(request) -> str``;
    - ``raise_on_defer``: raise instead of returning a deferred response;
    - ``store_failure``: ``"open"`` or ``"closed"`` while the store fails;
    - ``on_decision``: the decision hooks, a tuple;
    - ``quota``: a :class:`~retry_after_adapter.Quota`, a tuple of one of each unit
      (requests first), or None;
    - ``max_concurrency``: attempts of a scope on the wire at once, or None;
    - ``lease_ttl``: seconds a concurrency slot is held at most;
    - ``max_waiting``: calls of a scope that may wait in this process, or None;
    - ``learn_rate``: learn a send rate per scope when nothing is configured or announced;
    - ``cost``: what a request costs in tokens, an int or a function of the request
      (see :mod:`~retry_after_adapter.cost`), or None.
    - ``replay_unprocessed``: send a request the policy does not replay (a POST) again
      after a 429 whose provider documents it as not processed (OpenAI's, Anthropic's:
      ``dialects.not_processed``), once the wait, which must fit, has passed; None: the
      front end's default (the httpx transports, which the SDKs run on: True; requests
      and urllib3: False, urllib3's rule stands).

    A new option is a field here and a key of :class:`Options`, and nothing else of
    the front ends changes."""

    cooldown: Any = DEFAULT
    scope: Any = None
    raise_on_defer: bool = False
    store_failure: str = "open"
    on_decision: Any = None
    quota: Quota | tuple[Quota, ...] | None = None
    max_concurrency: int | None = None
    lease_ttl: float = DEFAULT_LEASE_TTL
    max_waiting: int | None = None
    learn_rate: bool = True
    cost: Any = None
    replay_unprocessed: bool | None = None

    def __post_init__(self) -> None:
        cooldown = DEFAULT_STORE if self.cooldown is DEFAULT else self.cooldown
        checked = {
            "on_decision": as_hooks(self.on_decision),
            "store_failure": check_store_failure(self.store_failure),
            "cooldown": cooldown,
            "scope": "origin" if self.scope is None else self.scope,
            "raise_on_defer": bool(self.raise_on_defer),
            "max_concurrency": _check_count("max_concurrency", self.max_concurrency, 1),
            "lease_ttl": _check_ttl(self.lease_ttl),
            "max_waiting": _check_count("max_waiting", self.max_waiting, 0),
            "cost": check_cost_option(self.cost),
        }
        quota, cost = _check_quota(self.quota, cooldown), checked["cost"]
        tokens = quota_of(quota, "tokens")
        if tokens is not None and isinstance(cost, int) and cost > tokens.limit:
            raise cost_error(cost, FIXED, token_quota(tokens.limit, tokens.per))  # a fixed cost: known now
        if checked["max_concurrency"] is not None and cooldown is None:
            raise ConfigurationError("max_concurrency is shared through a store: cooldown= must not be None")
        if not isinstance(self.learn_rate, bool):
            raise ConfigurationError("learn_rate must be True or False")
        replays = self.replay_unprocessed
        if replays is not None and not isinstance(replays, bool):
            raise ConfigurationError(f"replay_unprocessed must be True, False or None, not {replays!r}")
        checked["quota"] = quota
        for name, value in checked.items():
            object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        # The store and the hooks by type only: their own reprs may name a URL with a
        # password, a token in a partial's arguments.
        scope = self.scope if isinstance(self.scope, str) else type(self.scope).__name__
        hooks = ", ".join(type(hook).__name__ for hook in self.on_decision)
        return (
            f"Settings(cooldown={store_name(self.cooldown)}, scope={scope!r}, "
            f"raise_on_defer={self.raise_on_defer}, store_failure={self.store_failure!r}, "
            f"on_decision=({hooks}), quota={self.quota!r}, max_concurrency={self.max_concurrency}, "
            f"lease_ttl={self.lease_ttl}, max_waiting={self.max_waiting}, learn_rate={self.learn_rate}, "
            f"cost={self.cost if not callable(self.cost) else type(self.cost).__name__}, "
            f"replay_unprocessed={self.replay_unprocessed})"
        )

    @classmethod
    def take(cls, keywords: dict[str, Any]) -> Settings:
        """The settings from the option keywords in ``keywords`` (removed from it: what
        is left is the library's own)."""
        return cls(**{name: keywords.pop(name) for name in _OPTION_NAMES if name in keywords})

    @staticmethod
    def refuse_unknown(owner: str, rest: Collection[str], own: Collection[str] | None) -> None:
        """Raise ConfigurationError for a keyword left after :meth:`take` that ``owner``
        does not take: one not among ``own`` (the library's own keywords; None: any, as
        urllib3's connection pool keywords, but one that looks like a misspelled option,
        ``quoat``, is refused still). The error names the keyword, and the option it
        looks like."""
        known = (*_OPTION_NAMES, *(own or ()))
        for keyword in rest:
            # Taken: one of ``own``; with no ``own``, any that looks like no option.
            taken = keyword in own if own is not None else close_keyword(keyword, known) is None
            if not taken:
                raise unknown_keyword(owner, keyword, known)

    def keywords(self) -> dict[str, Any]:
        """The options as keywords a front end takes again (a copy or an unpickling)."""
        return {name: getattr(self, name) for name in _OPTION_NAMES}


_OPTION_NAMES = tuple(field.name for field in fields(Settings))


#: Serialises options set after construction, in every front end (rare).
_SETTING = threading.Lock()
_forksafe.at_fork(lambda: globals().update(_SETTING=threading.Lock()))


def _plan_of(settings: Settings) -> tuple[Any, ...]:
    """What a plan is made from."""
    return (
        settings.cooldown, settings.store_failure, settings.quota, settings.max_concurrency,
        settings.lease_ttl, settings.max_waiting, settings.learn_rate, settings.replay_unprocessed,
    )  # (not ``cost``: read per call)


def _plan(settings: Settings, replays: bool = False) -> Plan:
    """The plan every call of a front end with ``settings`` runs on (``replays``: the
    front end's default for ``replay_unprocessed``): raises ``ConfigurationError`` when
    the store cannot carry what the settings ask."""
    store = shared(settings.cooldown)
    if store is not None and settings.quota is not None and QuotaLogs not in store.capabilities:
        raise ConfigurationError(
            "a quota needs a store that takes permits (the QuotaLogs capability); "
            f"{type(settings.cooldown).__name__} does not: add the mixin to it, or "
            "use MemoryCooldownStore, SQLiteCooldownStore or RedisCooldownStore"
        )
    if store is not None and settings.max_concurrency is not None and Leases not in store.capabilities:
        raise ConfigurationError(
            "max_concurrency needs a store that holds leases "
            "(the Leases capability); "
            f"{type(settings.cooldown).__name__} does not: add the mixin to it, or "
            "use MemoryCooldownStore, SQLiteCooldownStore or RedisCooldownStore"
        )
    tokens = quota_of(settings.quota, "tokens")
    if store is not None and tokens is not None and Weights not in store.capabilities:
        raise ConfigurationError(
            "a token quota needs a store that weighs permits (the Weights capability); "
            f"{type(settings.cooldown).__name__} does not: "
            "use MemoryCooldownStore, SQLiteCooldownStore or RedisCooldownStore"
        )
    return Plan(
        store,
        fail_closed=settings.store_failure == "closed",
        quota=quota_of(settings.quota, "requests"),
        tokens=tokens,
        slots=settings.max_concurrency,
        ttl=settings.lease_ttl,
        max_waiting=settings.max_waiting,
        learn_rate=settings.learn_rate,
        replays=replays if settings.replay_unprocessed is None else settings.replay_unprocessed,
    )


class SharedSettings:
    """What every front end shares: its :class:`Settings` (``settings``; each option is
    also an attribute of the front end, ``adapter.quota``, and setting one, or
    ``settings`` itself, checks it and makes again what it changes), and the plan every
    call of the front end runs on (built once, again after a copy or an unpickling)."""

    settings: Settings
    #: Whether a request a provider's answer says was not processed is sent again when
    #: ``replay_unprocessed`` is None (see :class:`Settings`): not here (urllib3's rule,
    #: requests'), the httpx transports' own says yes.
    replays_unprocessed = False
    #: The plan every call runs on, and how a request's scope is found (see _derived).
    _plan: Plan
    _scope_fn: Callable[[Any], str]

    if TYPE_CHECKING:  # the options, as attributes (read-only properties, made below the class)
        cooldown: CooldownStore | None
        scope: str | ScopeFunction
        raise_on_defer: bool
        store_failure: str
        on_decision: tuple[DecisionHook, ...]
        quota: Quota | tuple[Quota, ...] | None
        max_concurrency: int | None
        lease_ttl: float
        max_waiting: int | None
        learn_rate: bool
        cost: int | CostFunction | None
        replay_unprocessed: bool | None

    def __setattr__(self, name: str, value: Any) -> None:
        # An option set after construction (``adapter.on_decision += (hook,)``) is
        # checked as at construction; nothing changes unless all of it is good.
        if (name in _OPTION_NAMES or name == "settings") and "settings" in self.__dict__:
            with _SETTING:  # two threads setting options: neither update is lost
                old: Settings = self.__dict__["settings"]
                new = value if name == "settings" else replace(old, **{name: value})
                if not isinstance(new, Settings):
                    raise ConfigurationError("settings must be a Settings")
                self._publish(new, self._derived(new, old))
            return
        object.__setattr__(self, name, value)

    def _share(self, settings: Settings) -> None:
        self.settings = settings
        self._derive()

    def _derive(self) -> None:
        """Derive what is not kept when the owner is copied or pickled: the plan."""
        self._publish(self.settings, self._derived(self.settings, None))

    def _derived(self, settings: Settings, old: Settings | None) -> dict[str, Any]:
        """The plan and the scope function ``settings`` make (checked: raises before
        anything is set). From ``old`` settings, what they made is kept where nothing
        it depends on changed: a plan's dialects (routes, streaks) stay while its store
        and scope do."""
        derived: dict[str, Any] = {}
        if old is None or _plan_of(old) != _plan_of(settings):
            derived["_plan"] = _plan(settings, self.replays_unprocessed)
            if old is not None and (old.cooldown, old.scope) == (settings.cooldown, settings.scope):
                derived["_plan"].dialects = self.__dict__["_plan"].dialects
        if old is None or old.scope != settings.scope:
            derived["_scope_fn"] = resolve_scope(settings.scope)
        return derived

    def _publish(self, settings: Settings, derived: dict[str, Any]) -> None:
        """Set ``settings`` and what they made at once, then the front end's own."""
        self.__dict__.update(settings=settings, **derived)
        self._published()

    def _published(self) -> None:
        """A front end's own state made from its plan (nothing here)."""

    # -- the result: one decision, each library's own types ----------------------------
    #: Whether a deferred redirect is raised rather than returned (requests and httpx
    #: would follow a returned one at once; urllib3 returns it).
    defers_redirects = True

    def _result(self, context: Any, call: Call, outcome: Outcome[Any]) -> Any:
        """Turn ``outcome`` into what the library's caller gets: its response, its local
        429, or its exception, built by the front end's hooks below from ``context``
        (what the call carries: its request)."""
        deferral = outcome.deferral
        error = outcome.error
        if error is not None:
            failure = self._failed(context, error, deferral)
            if failure is error:
                raise error
            raise failure from error
        if outcome.response is None:  # deferred before anything was sent
            assert deferral is not None
            if self.settings.raise_on_defer:
                raise self._deferred(context, call, deferral, None, None)
            return self._local(context, deferral)
        response = self._adopt(context, outcome.response, outcome)
        if deferral is None:
            return self._finished(context, call, response, outcome) if outcome.redirect else response
        if (
            self.settings.raise_on_defer
            or (outcome.redirect and self.defers_redirects)
            or (outcome.exhausted and call.policy.raise_on_status)
        ):
            raise self._deferred(context, call, deferral, response, outcome.limit)
        return response

    def _failed(self, context: Any, error: BaseException, deferral: Deferral | None) -> BaseException:
        """The exception for a last attempt that failed in transport (``error`` itself,
        or the library's deferral exception wrapping it)."""
        raise NotImplementedError

    def _local(self, context: Any, deferral: Deferral) -> Any:
        """The library's 429 for a call deferred before anything was sent."""
        raise NotImplementedError

    def _adopt(self, context: Any, response: Any, outcome: Outcome[Any]) -> Any:
        """The library's response with the outcome's deferral and stop reason on it."""
        raise NotImplementedError

    def _finished(self, context: Any, call: Call, response: Any, outcome: Outcome[Any]) -> Any:
        """A redirect that is not deferred, returned to the library (which follows it:
        the hop records its call here)."""
        return response

    def _deferred(
        self, context: Any, call: Call, deferral: Deferral, response: Any, limit: MaxRetryError | None
    ) -> BaseException:
        """The library's exception for a deferred call (``response`` None: nothing was
        sent; else its body is kept readable first); ``limit``: the policy that ran
        out, if retries did."""
        raise NotImplementedError

    def freshness(self, target: str) -> Freshness | None:
        """The freshness of a scope, or of the scope of a URL (``target`` with ``://``,
        scoped as a GET of it would be): its last success, last error class and next
        eligible time, as every worker sharing the store noted them (None: nothing
        known, or no store)."""
        store = self._plan.store
        if store is None or FreshnessLog not in store.capabilities:
            return None
        scope = self._scope_fn(RequestInfo("GET", target, {})) if "://" in target else target
        return store.freshness(scope)

    #: Whether a store operation made here would block an event loop (an async front end
    #: on a store not kept in memory: see ``StoreThreads``): what a call reads before its
    #: first attempt is then read from this process's copy.
    _blocking = False

    def _refines_models(self, request: Any, url: str) -> bool:
        """Whether a request naming a model in its path (``models/<m>:<verb>``) is
        admitted per model, as Gemini's quotas are: only a Google client's request (its
        ``x-goog-api-key`` or ``x-goog-api-client`` header, or a ``googleapis.com``
        host), on a built-in scope (a scope of your own is used as you made it), and
        with no configured ``Quota`` or ``max_concurrency`` (they bind the scope as
        configured, not each model)."""
        plan = self._plan
        if plan.limit is not None or plan.slots is not None:
            return False
        scope = self.settings.scope
        if scope is not None and not isinstance(scope, str):
            return False
        return google_client(getattr(request, "headers", None), url)

    def _call(self, policy: RetryAfterRetry, request: Any, original: Any = None) -> Call:
        """A new call of ``request`` under ``policy`` and the enclosing ``budget()``
        (scoped by its route's bucket once the route reported one); its cost in tokens
        by the ``cost=`` option (given ``original``, the library's own request, when
        ``request`` is not) unless the ``budget()`` says it."""
        override = current_override()
        settings = self.settings
        scope = self._scope_fn(request)
        call = Call(policy, self._plan, scope=scope, hooks=settings.on_decision, override=override)
        if settings.cost is not None and (override is None or override.cost is None):
            call.progress.cost = cost_of(settings.cost, request if original is None else original)
            call.progress.cost_from = settings.cost
        if self._plan.dialects.routes:
            refine_call(call, request.method, request.url, self._blocking)
        url = request.url
        if url and "odels/" in url and self._refines_models(request, url):  # (one test on any other URL)
            refine_gemini(call, url, self._blocking)
        if self._plan.replays and not isinstance(getattr(request, "body", None), (bytes, str, type(None))):
            call.progress.resendable = False  # a file, a generator: read once as it is sent
        return call


def _option(name: str) -> property:
    """The option ``name`` of a front end, read from its :class:`Settings` (a property,
    not ``__getattr__``: a class with ``__getattr__`` gets no fast attribute reads, and
    every GET reads the adapter's attributes)."""

    def read(self: SharedSettings) -> Any:
        return getattr(self.settings, name)

    return property(read, doc=f"The ``{name}`` option (setting it checks it as at construction).")


for _name in _OPTION_NAMES:
    setattr(SharedSettings, _name, _option(_name))
