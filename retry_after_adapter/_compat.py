"""Every difference between urllib3 1.26.x and 2.x that the package depends on.

Nothing outside this module looks at urllib3's version.
"""

from __future__ import annotations

import inspect
import io
from collections.abc import Callable
from importlib.metadata import version as _dist_version
from typing import Any

from urllib3._collections import HTTPHeaderDict
from urllib3.response import HTTPResponse
from urllib3.util.retry import Retry

#: urllib3's version as a tuple of ints, e.g. (2, 7, 0).
URLLIB3_VERSION: tuple[int, ...] = tuple(
    int(part) for part in _dist_version("urllib3").split(".")[:3] if part.isdigit()
)
IS_URLLIB3_V1 = URLLIB3_VERSION < (2,)

_RETRY_PARAMS = frozenset(inspect.signature(Retry.__init__).parameters) - {"self", "history"}
#: Every keyword this urllib3's ``Retry`` takes (its version's names).
RETRY_KEYWORDS = _RETRY_PARAMS | {"history"}

#: Whether this urllib3 has its own Retry-After cap (2.6.3+ ``retry_after_max``). We
#: never call the methods that apply it, so it can never shorten a wait of ours.
HAS_RETRY_AFTER_MAX = "retry_after_max" in _RETRY_PARAMS

#: The methods urllib3 treats as idempotent (GET, HEAD, PUT, DELETE, OPTIONS, TRACE).
DEFAULT_ALLOWED_METHODS: frozenset[str] = frozenset(Retry.DEFAULT_ALLOWED_METHODS)


def retry_arguments(retry: Retry) -> dict[str, Any]:
    """The constructor arguments that rebuild ``retry`` on this urllib3 (no history)."""
    # 1.26 also accepts the deprecated "method_whitelist" (same value as
    # allowed_methods; reading it warns, and passing both is an error): skip it.
    names = _RETRY_PARAMS - {"method_whitelist"}
    return {name: getattr(retry, name) for name in names if hasattr(retry, name)}


def local_response(
    *, status: int, reason: str, headers: dict[str, str], body: bytes, method: str | None, url: str | None
) -> HTTPResponse:
    """A urllib3 response built here, not received (a locally deferred 429)."""
    return HTTPResponse(
        body=io.BytesIO(body),
        headers=HTTPHeaderDict({**headers, "Content-Length": str(len(body))}),
        status=status,
        reason=reason,
        preload_content=False,
        decode_content=False,
        request_method=method,
        request_url=url,
    )


def header_getter(response: Any) -> Callable[[str], str | None]:
    """A reader of a response's header fields by name (any case; repeated fields joined
    with ", "), for reading many: the fields made into one dictionary first, for
    urllib3's headers (``_container``: lower-case name -> [name, values...]) and
    httpx's and httpx2's (``multi_items()``: lower-case names); otherwise the headers'
    own ``get``. A field looked up there costs a dictionary look-up, not a pass over
    every field."""
    headers = getattr(response, "headers", None)
    if headers is None:
        return lambda name: None
    fields: dict[str, str] = {}
    container = getattr(headers, "_container", None)
    if type(container) is dict:
        for key, entry in container.items():
            fields[key] = ", ".join(entry[1:])
    elif callable(getattr(headers, "multi_items", None)):
        for key, value in headers.multi_items():
            fields[key] = f"{fields[key]}, {value}" if key in fields else value
    else:
        return lambda name: response_header(response, name)
    return lambda name: fields.get(name.lower())


def response_header(response: Any, name: str) -> str | None:
    """A header of a urllib3 response, repeated fields joined with ", " (both versions)."""
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    value = headers.get(name)
    return None if value is None else str(value)


#: The fields (lower case) that announce a quota: the IETF and X-RateLimit ones first,
#: then OpenAI's (and Azure OpenAI's) and Anthropic's remaining fields, one per kind.
QUOTA_FIELDS = (
    "ratelimit",
    "x-ratelimit-remaining",
    "x-ratelimit-remaining-requests",
    "x-ratelimit-remaining-tokens",
    "anthropic-ratelimit-requests-remaining",
    "anthropic-ratelimit-tokens-remaining",
    "anthropic-ratelimit-input-tokens-remaining",
    "anthropic-ratelimit-output-tokens-remaining",
)
_QUOTA_KEYS = frozenset(QUOTA_FIELDS)
_QUOTA_NAMES = frozenset(name.encode("ascii") for name in QUOTA_FIELDS)


def announces_quota(response: Any) -> bool:
    """Whether a response has one of :data:`QUOTA_FIELDS`. Asked of every response: on
    urllib3's own headers (both versions keep them in ``_container``, keyed by the
    lower-case name) one pass over the names; on httpx's (``_list`` of raw
    name, lower-case name, value) one pass over the names."""
    headers = getattr(response, "headers", None)
    if headers is None:
        return False
    names = getattr(headers, "_container", None)
    if type(names) is dict or isinstance(names, dict):
        return not _QUOTA_KEYS.isdisjoint(names)  # one pass over its few names, in C
    items = getattr(headers, "_list", None)
    if type(items) is list:
        return not _QUOTA_NAMES.isdisjoint([item[1] for item in items])
    return any(name in headers for name in QUOTA_FIELDS)  # its own lookup
