"""What a request costs in tokens: the ``cost=`` option of every front end (an int, or
a function of the request) and ``budget(cost=...)``, checked here; and
:func:`max_tokens`, a ready ``cost=`` for the LLM APIs' JSON bodies.

A cost is an int from 0 to :data:`MAX_COST` (0 or None: the request declares none, and
costs nothing of a token quota), checked here once, before any store sees it: every
store then holds it and every sum of it exactly (a SQLite integer, a Redis script's
number). A cost outside that (negative, too large, a float, a bool) is a
ConfigurationError naming the cost and where it came from (:func:`cost_origin`). The
function is given the front end's own request: a
``requests.PreparedRequest`` (``RetryAfterAdapter``), an ``httpx.Request`` or
``httpx2.Request`` (the transports), an ``aiohttp.ClientRequest`` (the aiohttp
middleware), or a
:class:`~retry_after_adapter.scope.RequestInfo` with its ``body``
(``RetryAfterPoolManager``).
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable
from typing import Any

from .errors import ConfigurationError
from .header import MAX_COUNT

__all__ = ["MAX_COST", "CostFunction", "cost_of", "max_tokens"]

#: ``cost=`` as a function: the request -> its cost in tokens (None: none declared).
CostFunction = Callable[[Any], "int | None"]

#: The JSON fields an LLM API's request bounds its output by, read in this order.
MAX_TOKENS_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


#: The largest cost a request may declare, in tokens: the largest count the package
#: reads from any header (``header.MAX_COUNT``, 2**31 - 1), so no announced allowance
#: is larger, and far below what a store would round or overflow (a Redis script
#: computes in doubles, exact to 2**53; SQLite's integers end at 2**63 - 1) however
#: many costs it adds up.
MAX_COST = MAX_COUNT

#: Where a cost came from, as :func:`cost_origin` names it: ``budget(cost=...)``, or
#: the ``cost=`` option given as a number.
BUDGET = "budget(cost=...)"
FIXED = "cost= (a fixed cost)"


def cost_origin(origin: object) -> str:
    """Where a cost came from, in words: ``origin`` is the ``cost=`` option (a function:
    named by its qualified name, never its arguments or repr, which may hold secrets;
    a number: a fixed cost) or a description (:data:`BUDGET`, :data:`FIXED`)."""
    if isinstance(origin, str):
        return origin
    if callable(origin):
        name = getattr(origin, "__qualname__", None)
        if not isinstance(name, str):
            name = getattr(getattr(origin, "func", None), "__qualname__", None)  # a functools.partial
        if not isinstance(name, str):
            name = type(origin).__qualname__
        return f"the cost= function {name}"
    return FIXED


def check_cost(value: object, origin: object = FIXED) -> int:
    """``value`` as a cost: an int from 0 to :data:`MAX_COST` (None: 0; an integer type
    such as NumPy's: its int), else a ConfigurationError naming the value and
    ``origin`` (see :func:`cost_origin`; a str: named as given)."""
    if value is None:
        return 0
    if type(value) is int and 0 <= value <= MAX_COST:
        return value
    number = None
    if not isinstance(value, bool):
        try:
            number = operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            number = None
    if number is not None and 0 <= number <= MAX_COST:
        return number
    shown = repr(value) if isinstance(value, (int, float)) else f"a {type(value).__name__}"
    raise ConfigurationError(
        f"a cost of {shown} ({cost_origin(origin)}): a cost is an int from 0 to {MAX_COST} tokens, or None"
    )


def check_cost_option(value: object) -> int | CostFunction | None:
    """The ``cost=`` option checked: None, a fixed cost (see :func:`check_cost`), or a
    function of the request."""
    if value is None or callable(value):
        return value
    return check_cost(value, FIXED)


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
        raise ConfigurationError(f"{cost_origin(option)} raised {type(exc).__name__}") from exc
    if type(value) is int and 0 <= value <= MAX_COST:
        return value
    return check_cost(value, option)


def cost_error(cost: int, origin: object, limit: str) -> ConfigurationError:
    """The error for a cost that can never be admitted: ``cost`` tokens from ``origin``
    (see :func:`cost_origin`) above ``limit`` (what it exceeds, in words)."""
    return ConfigurationError(
        f"a request's cost of {cost} tokens ({cost_origin(origin)}) exceeds {limit}: "
        "it could never be admitted"
    )


def _body(request: Any) -> Any:
    """A request's body as the front ends hold it (bytes, str, or None when it is not
    at hand: a stream not read)."""
    if hasattr(request, "extensions") and hasattr(request, "stream"):  # httpx / httpx2
        try:
            return request.content
        except Exception:  # a stream not read: no body at hand
            return None
    body = getattr(request, "body", None)
    held = getattr(body, "_value", None)  # an aiohttp payload held whole (bytes, json=, a form)
    return held if isinstance(held, bytes) and not isinstance(body, (bytes, str)) else body


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
