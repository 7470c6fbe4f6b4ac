"""``get URL``: fetch a URL under the retry policy; a deferral is printed as JSON and
exits 75, so a cron job can reschedule at ``eligible_at``."""

from __future__ import annotations

import argparse
import json
import socket
import ssl
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..redact import argument_secrets, safe_url
from ._output import EX_FAILED, EX_OK, EX_TEMPFAIL, EX_UNAVAILABLE, EX_USAGE, err, open_store, redactor

if TYPE_CHECKING:
    import requests

    from ..retry import RetryAfterRetry

_NOT_VALID = "not a valid URL"
_NOT_HTTP = "not an http:// or https:// URL"


def cmd_get(args: argparse.Namespace) -> int:
    import requests

    from ..adapter import DEFAULT_STORE, RetryAfterAdapter
    from ..errors import ConfigurationError

    url: str = args.url
    shown = safe_url(url)
    headers = _learn_secrets(url, args.header)
    problem = _url_problem(url)
    if problem is not None:
        err(f"error: {problem}: {shown}")
        return EX_USAGE
    try:
        store = open_store(args.cooldown, DEFAULT_STORE)
    except (ConfigurationError, ImportError) as exc:
        err(f"error: --cooldown: {exc}")
        return EX_USAGE
    stops: list[str] = []
    try:
        retry = _retry(args, stops)
    except ConfigurationError as exc:
        err(f"error: {exc}")
        return EX_USAGE
    session = requests.Session()
    adapter = RetryAfterAdapter(max_retries=retry, cooldown=store)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    response = _send(session, args, headers, shown)
    if isinstance(response, int):
        return response
    return _finish(response, retry, stops, shown)


def _learn_secrets(url: str, header_args: list[tuple[str, str]]) -> dict[str, str]:
    """The request headers; the URL's secrets and every header value go to the redactor."""
    redactor.add_all(argument_secrets(url))
    headers: dict[str, str] = {}
    for name, value in header_args:
        redactor.add(value)
        headers[name] = value
    return headers


def _url_problem(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        return _NOT_VALID
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        return _NOT_HTTP
    return None


def _retry(args: argparse.Namespace, stops: list[str]) -> RetryAfterRetry:
    """The retry policy ``get``'s options ask for; every stop reason is added to ``stops``."""
    from ..observe import DecisionRecord
    from ..policy import STOP
    from ..retry import RetryAfterRetry

    def note(record: DecisionRecord) -> None:
        if record.action == STOP and record.reason:
            stops.append(record.reason)

    return RetryAfterRetry(
        total=args.retries,
        deadline=args.deadline,
        max_wait=args.max_wait,
        backoff_factor=0.5,
        raise_on_status=False,
        on_decision=note,
    )


def _send(
    session: requests.Session, args: argparse.Namespace, headers: dict[str, str], shown: str
) -> requests.Response | int:
    """The final response, or (after a message) the exit code of a call that ended without
    one. Closes ``session``."""
    import requests

    from ..deferred import RetryDeferred
    from ..errors import RetryAfterError

    try:
        return session.request(args.method, args.url, headers=headers, timeout=args.timeout)
    except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
        # Also when the last attempt's error carries a deferral: the server is unreachable.
        err(f"cannot reach {shown}: {_transport_reason(exc)}")
        return EX_UNAVAILABLE
    except RetryDeferred as exc:
        return _print_deferral(exc.deferral)
    except requests.exceptions.InvalidURL:
        err(f"error: {_NOT_VALID}: {shown}")
        return EX_USAGE
    except (requests.exceptions.MissingSchema, requests.exceptions.InvalidSchema):
        err(f"error: {_NOT_HTTP}: {shown}")
        return EX_USAGE
    except (requests.exceptions.ChunkedEncodingError, requests.exceptions.ContentDecodingError) as exc:
        err(f"the response from {shown} broke off: {_transport_reason(exc)}")
        return EX_UNAVAILABLE
    except requests.exceptions.TooManyRedirects:
        err(f"too many redirects from {shown}")
        return EX_FAILED
    except RetryAfterError as exc:
        err(f"{type(exc).__name__}: {exc}")
        return EX_FAILED
    except requests.exceptions.RequestException as exc:
        err(f"request to {shown} failed: {type(exc).__name__}")
        return EX_FAILED
    finally:
        session.close()


def _finish(response: requests.Response, retry: RetryAfterRetry, stops: list[str], shown: str) -> int:
    """Print the final response's body (or its deferral); a note on stderr unless it is a 2xx."""
    from ..deferral import deferral_of
    from ..policy import Reason

    deferral = deferral_of(response)
    if deferral is not None and deferral.reason != Reason.ATTEMPTS:
        return _print_deferral(deferral)
    body = response.content
    sys.stdout.buffer.write(body)
    sys.stdout.flush()
    if 200 <= response.status_code < 300:
        return EX_OK
    reason = getattr(response, "stop_reason", None) or (stops[-1] if stops else None)
    if deferral is not None:  # retries used up: the server's next eligible time is kept
        reason = f"retries used up; eligible again at {deferral.eligible_at.isoformat()}"
    if reason is None:
        retried = response.status_code in (retry.status_forcelist or ())
        reason = "none" if retried else f"none; {response.status_code} is not a retried status"
    err(f"HTTP {response.status_code} from {shown} (stop_reason: {reason})")
    return EX_FAILED


def _print_deferral(deferral: Any) -> int:
    sys.stdout.write(json.dumps(deferral.to_dict(), sort_keys=True) + "\n")
    sys.stdout.flush()
    err(
        f"deferred ({deferral.reason}): eligible at {deferral.eligible_at.isoformat()} "
        f"(in {deferral.delay:.1f} s)"
    )
    return EX_TEMPFAIL


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and the exceptions behind it (causes, contexts, wrapped reasons)."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo and len(seen) < 32:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for nxt in (
            getattr(current, "reason", None),
            *(a for a in current.args if isinstance(a, BaseException)),
            current.__cause__,
            current.__context__,
        ):
            if isinstance(nxt, BaseException):
                todo.append(nxt)


def _transport_reason(exc: BaseException) -> str:
    """A short, secret-free description of why a request failed at the transport level."""
    from urllib3.exceptions import ConnectTimeoutError, ProtocolError, ReadTimeoutError

    chain = list(_chain(exc))
    kinds: list[tuple[type[BaseException] | tuple[type[BaseException], ...], str]] = [
        (ConnectionRefusedError, "connection refused"),
        (socket.gaierror, "host name could not be resolved"),
        (ssl.SSLError, "TLS error"),
        (ConnectionResetError, "connection reset by the server"),
        (ReadTimeoutError, "timed out waiting for the response"),
        ((TimeoutError, socket.timeout), "timed out"),
        (ConnectTimeoutError, "timed out connecting"),
        (ProtocolError, "connection broken"),
        (OSError, "network error"),
    ]
    for kind, text in kinds:
        for item in chain:
            # urllib3's NewConnectionError subclasses ConnectTimeoutError without being one.
            fake_timeout = kind is ConnectTimeoutError and type(item).__name__ == "NewConnectionError"
            if isinstance(item, kind) and not fake_timeout:
                return text
    return type(exc).__name__
