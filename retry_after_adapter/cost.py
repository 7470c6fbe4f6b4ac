"""What a request costs in tokens: the ``cost=`` option of every front end (an int, or
a function of the request) and ``budget(cost=...)``, checked here; and
:func:`max_tokens`, a ready ``cost=`` for the LLM APIs' JSON bodies.

A cost is an int >= 0 (0 or None: the request declares none, and costs nothing of a
token quota). The function is given the front end's own request: a
``requests.PreparedRequest`` (``RetryAfterAdapter``), an ``httpx.Request`` or
``httpx2.Request`` (the transports), or a
:class:`~retry_after_adapter.scope.RequestInfo` with its ``body``
(``RetryAfterPoolManager``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from .errors import ConfigurationError

__all__ = ["CostFunction", "cost_of", "max_tokens"]

#: ``cost=`` as a function: the request -> its cost in tokens (None: none declared).
CostFunction = Callable[[Any], "int | None"]

#: The JSON fields an LLM API's request bounds its output by, read in this order.
MAX_TOKENS_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def check_cost(value: object, name: str = "cost") -> int:
    """``value`` as a cost: an int >= 0 (None: 0); else ConfigurationError naming it."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(f"{name} must be an int >= 0 (tokens) or None, not {type(value).__name__}")
    if value < 0:
        raise ConfigurationError(f"{name} must be an int >= 0 (tokens) or None, not {value}")
    return value


def check_cost_option(value: object) -> int | CostFunction | None:
    """The ``cost=`` option checked: None, an int >= 0, or a function of the request."""
    if value is None or callable(value):
        return value
    return check_cost(value)


def cost_of(option: int | CostFunction, request: Any) -> int:
    """The cost ``option`` gives ``request`` (see the module); a function's answer is
    checked, and an error it raises is the package's ConfigurationError naming it."""
    if not callable(option):
        return option
    try:
        value = option(request)
    except ConfigurationError:
        raise
    except Exception as exc:
        raise ConfigurationError(f"the cost= function raised {type(exc).__name__}") from exc
    return check_cost(value, "what the cost= function returned")


def _body(request: Any) -> Any:
    """A request's body as the front ends hold it (bytes, str, or None when it is not
    at hand: a stream not read)."""
    if hasattr(request, "extensions") and hasattr(request, "stream"):  # httpx / httpx2
        try:
            return request.content
        except Exception:  # a stream not read: no body at hand
            return None
    return getattr(request, "body", None)


def max_tokens(request: Any) -> int | None:
    """A ready ``cost=``: the ``max_tokens`` (or ``max_completion_tokens``,
    ``max_output_tokens``) of a request's JSON body, the most it may spend of an LLM
    API's output tokens; None (no cost) for a body that is not such JSON."""
    body = _body(request)
    if not body or not isinstance(body, (bytes, str)):
        return None
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    for field in MAX_TOKENS_FIELDS:
        value = data.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    return None
