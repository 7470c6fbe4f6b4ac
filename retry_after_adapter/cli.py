"""The command line: ``retry-after-adapter`` (also ``python -m retry_after_adapter``).

Commands:

- ``demo``: run a fleet of workers through a local quota-enforcing server, once with
  stock urllib3 ``Retry`` and once with ``RetryAfterAdapter``, and compare.
- ``get URL``: fetch a URL under the retry policy; a deferral is printed as JSON and
  exits 75, so a cron job can reschedule at ``eligible_at``.
- ``explain VALUE``: show how a Retry-After value is parsed and what the policy would
  decide.
- ``status --cooldown URL``: list the cooldowns a shared store holds.
- ``clear SCOPE --cooldown URL``: lift one scope's stored cooldown.

Exit codes: 0 success; 1 failure (a non-2xx final response, an invalid Retry-After in
``explain``); 2 bad arguments; 69 (EX_UNAVAILABLE) the server could not be reached;
75 (EX_TEMPFAIL) deferred; 130 interrupted.

Nothing printed here ever contains a header value given with ``--header``, a URL's query
string or its user info. Times are aware UTC, durations in seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import re
import socket
import ssl
import sys
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta, timezone
from typing import IO, Any, NoReturn
from urllib.parse import urlsplit

from . import __version__

EX_OK = 0
EX_FAILED = 1
EX_USAGE = 2
EX_UNAVAILABLE = 69
EX_TEMPFAIL = 75
EX_INTERRUPTED = 130

PROG = "retry-after-adapter"

_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_METHOD = re.compile(r"[A-Z]+")

#: ``get``'s default deadline in seconds: an unreachable host or a slow server costs a
#: cron job at most this long (``--deadline none`` lifts it).
DEFAULT_GET_DEADLINE = 10.0

#: ``explain``'s and ``get``'s bound on one Retry-After (the policy's default, a day).
DEFAULT_MAX_RETRY_AFTER = 86_400.0


# --------------------------------------------------------------------------- redaction
class _Redactor:
    """Removes secrets (header values, query strings, user info) from printed text."""

    def __init__(self) -> None:
        self.secrets: set[str] = set()

    def add(self, secret: str) -> None:
        secret = secret.strip()
        if len(secret) >= 3:
            self.secrets.add(secret)

    def learn_argv(self, argv: Sequence[str]) -> None:
        """Collect every header value and query string that appears on the command line,
        before parsing, so that even argparse's own error messages are scrubbed."""
        previous = ""
        for token in argv:
            if previous in ("--header", "-H"):
                self._add_header_token(token)
            elif token.startswith("--header="):
                self._add_header_token(token.partition("=")[2])
            elif token.startswith("-H") and len(token) > 2:
                self._add_header_token(token[2:])
            elif previous not in _VALUE_OPTIONS and _looks_like_header(token):
                # "Name: value" given in the wrong place (after a mistyped option, say).
                self._add_header_token(token)
            for part in _url_secrets(token):
                self.add(part)
            previous = token

    def _add_header_token(self, token: str) -> None:
        _, sep, value = token.partition(":")
        self.add(value if sep else token)

    def __call__(self, text: str) -> str:
        for secret in sorted(self.secrets, key=len, reverse=True):
            text = text.replace(secret, "***")
        return text


#: Options whose value is never a header (dates and times contain colons too).
_VALUE_OPTIONS = frozenset({"--date", "--received-at", "--cooldown", "--method"})
_HEADER_LIKE = re.compile(r"[A-Za-z][A-Za-z0-9_-]*:(?!//).*", re.DOTALL)


def _looks_like_header(token: str) -> bool:
    return _HEADER_LIKE.fullmatch(token) is not None


def _url_secrets(token: str) -> list[str]:
    """The query string, fragment and user info of anything that looks like a URL."""
    found: list[str] = []
    if "://" in token or token.startswith(("http", "redis", "valkey", "sqlite")):
        _, sep, rest = token.partition("://")
        netloc = rest.split("/", 1)[0] if sep else ""
        if "@" in netloc:
            found.append(netloc.rsplit("@", 1)[0])
    for mark in ("?", "#"):
        if mark in token:
            found.append(token.split(mark, 1)[1])
    return found


def safe_url(url: str) -> str:
    """``url`` without user info, query string or fragment, for messages."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    if not parts.scheme or not parts.netloc:
        cut = min((i for i in (url.find("?"), url.find("#")) if i >= 0), default=len(url))
        return url[:cut]
    host = parts.netloc.rsplit("@", 1)[-1]
    return f"{parts.scheme}://{host}{parts.path}"


_redact = _Redactor()


def _err(message: str) -> None:
    """One line on stderr, prefixed with the program name and scrubbed of secrets."""
    line = _redact(message).replace("\n", " ").strip()
    sys.stderr.write(f"{PROG}: {line}\n")
    sys.stderr.flush()


# --------------------------------------------------------------------------- argparse
class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (exit 2), scrubbed of secrets."""

    def error(self, message: str) -> NoReturn:
        line = _redact(message).replace("\n", " ")
        self.exit(EX_USAGE, f"{self.prog}: error: {line} (see {self.prog} --help)\n")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def _positive_seconds(text: str) -> float:
    value = _seconds(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def _seconds_or_none(text: str) -> float | None:
    if text.strip().lower() in ("none", "off", "inf"):
        return None
    return _seconds(text)


def _count(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {minimum}, got {value}")
        return value

    return parse


def _header(text: str) -> tuple[str, str]:
    # Never echo the value: it may be a credential.
    name, sep, value = text.partition(":")
    name = name.strip()
    if not sep or not _HEADER_NAME.fullmatch(name):
        raise argparse.ArgumentTypeError("expected 'Name: value' with a valid header name")
    value = value.strip()
    if any(ch in value for ch in "\r\n\x00"):
        raise argparse.ArgumentTypeError(f"the value of header {name!r} contains a line break or NUL")
    return name, value


def _method(text: str) -> str:
    method = text.strip().upper()
    if not _METHOD.fullmatch(method):
        raise argparse.ArgumentTypeError(f"not an HTTP method: {text!r}")
    return method


def _form(text: str) -> str:
    if text not in ("seconds", "date"):
        raise argparse.ArgumentTypeError("expected 'seconds' or 'date'")
    return text


def _aware_time(text: str) -> datetime:
    raw = text.strip()
    if raw[-1:] in ("Z", "z"):
        raw = raw[:-1] + "+00:00"
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not an ISO 8601 time: {text!r} (e.g. 2026-01-01T12:00:00Z)"
        ) from None
    if value.tzinfo is None or value.utcoffset() is None:
        raise argparse.ArgumentTypeError(f"{text!r} has no UTC offset (add Z or +00:00)")
    return value.astimezone(timezone.utc)


DEMO_EPILOG = """\
what it shows:
  A local server allows QUOTA requests per WINDOW seconds, shared by all clients, and
  answers 429 with Retry-After past that. The same fleet of WORKERS threads fetches
  ITEMS URLs through it twice: with stock requests + urllib3 Retry, then with
  RetryAfterAdapter and one shared cooldown store (a call whose wait does not fit its
  DEADLINE is deferred, and its item queued again for its eligible time). The table
  compares items done, deferrals, 429s provoked, requests sent while an announced
  cooldown was running, calls over the deadline, worst latency and wall time.
  Progress goes to stderr once a second. Needs no network: loopback only.

examples:
  retry-after-adapter demo
  retry-after-adapter demo --workers 50 --items 150 --quota 50
  retry-after-adapter demo --form date --deadline 3
  retry-after-adapter demo --json > demo.json     # table on stderr, JSON on stdout
"""

GET_EPILOG = """\
output and exit codes:
  0   2xx: the body on stdout
  1   another final status: the body on stdout, a note (status, stop reason) on stderr
  2   bad arguments
  69  the server could not be reached (refused, DNS, timeout, TLS)
  75  deferred: the deferral as JSON on stdout (reschedule at its eligible_at)

examples:
  retry-after-adapter get https://api.example.com/v1/items --deadline 10 --max-wait 5
  retry-after-adapter get https://api.example.com/v1/items \\
      --header 'Authorization: Bearer ...' --cooldown sqlite:///cooldown.db

  # a cron job: on exit 75, out holds the deferral; run again at its eligible_at
  retry-after-adapter get "$URL" --deadline 20 --cooldown sqlite:///cooldown.db > out
  if [ $? -eq 75 ]; then jq -r .eligible_at out; fi

cooldown stores (shared between processes that spend the same quota):
  memory://              this process only (the default)
  sqlite:///cooldown.db  every process on this host, through one SQLite file
  redis://host:6379/0    every process on every machine (needs the redis extra)

Header values, query strings and user info are never printed in messages.
"""

EXPLAIN_EPILOG = """\
examples:
  retry-after-adapter explain 120
  retry-after-adapter explain 120 --max-wait 30
  retry-after-adapter explain 20 --deadline 10 --elapsed 4
  retry-after-adapter explain 'Wed, 21 Oct 2026 07:28:00 GMT' \\
      --date 'Wed, 21 Oct 2026 07:27:00 GMT' --received-at 2026-10-21T07:27:03Z
  retry-after-adapter explain 'soon' --json        # invalid: exit 1

The decision uses the same rules as the adapter: wait = max(Retry-After, backoff);
defer when the wait exceeds --max-wait, or when elapsed + wait exceeds --deadline.
"""


STATUS_EPILOG = """\
examples:
  retry-after-adapter status --cooldown sqlite:///cooldown.db
  retry-after-adapter status --cooldown redis://localhost:6379/0 --json
  retry-after-adapter clear https://api.example.com:443 --cooldown sqlite:///cooldown.db

A scope from a scope function shows as its hash (sha256:...): clear it by that name.
A process whose store is failing keeps its own copy of a cooldown until the store
answers again; then the store's word (cleared) holds.
"""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the command line (all three commands)."""
    parser = _Parser(
        prog=PROG,
        description="Obey a server's Retry-After exactly: never shortened, never slept past\n"
        "your deadline, shared by every worker.",
        epilog="examples:\n  retry-after-adapter demo\n  retry-after-adapter get URL --deadline 10\n"
        "  retry-after-adapter explain 120 --max-wait 30\n\n"
        "Run 'retry-after-adapter COMMAND --help' for a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = commands.add_parser(
        "demo",
        help="compare stock urllib3 Retry with RetryAfterAdapter on a local throttling server",
        description="Run a fleet of workers through a local throttling server twice: with stock\n"
        "urllib3 Retry, then with RetryAfterAdapter and a shared cooldown, and print a\n"
        "side-by-side table.",
        epilog=DEMO_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_argument("--workers", type=_count(1), default=20, metavar="N", help="threads (default 20)")
    demo.add_argument("--items", type=_count(1), default=60, metavar="N", help="URLs to fetch (default 60)")
    demo.add_argument(
        "--quota", type=_count(1), default=20, metavar="N", help="requests allowed per window (default 20)"
    )
    demo.add_argument(
        "--window", type=_positive_seconds, default=2.0, metavar="S", help="quota window, seconds (default 2)"
    )
    demo.add_argument(
        "--deadline", type=_positive_seconds, default=2.0, metavar="S",
        help="seconds each call may take (default 2)",
    )  # fmt: skip
    demo.add_argument(
        "--form", type=_form, default="seconds", metavar="{seconds,date}",
        help="Retry-After as delay-seconds or as an HTTP-date (default seconds)",
    )  # fmt: skip
    demo.add_argument(
        "--json", action="store_true", help="print the result as JSON on stdout (the table goes to stderr)"
    )

    get = commands.add_parser(
        "get",
        help="fetch a URL under the policy; exit 75 with a JSON deferral when deferred",
        description="Fetch URL with RetryAfterAdapter. On success print the body; when the server's\n"
        "wait does not fit the budget, print the deferral as JSON and exit 75.",
        epilog=GET_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    get.add_argument("url", metavar="URL", help="an http:// or https:// URL")
    get.add_argument(
        "--deadline", type=_seconds_or_none, default=DEFAULT_GET_DEADLINE, metavar="S",
        help=f"seconds the whole call may take, waits included (default {DEFAULT_GET_DEADLINE:g}; "
        "'none' for no limit)",
    )  # fmt: skip
    get.add_argument(
        "--max-wait", type=_seconds_or_none, default=60.0, metavar="S",
        help="longest single wait in seconds; a longer one defers (default 60; 'none' for no limit)",
    )  # fmt: skip
    get.add_argument("--retries", type=_count(0), default=5, metavar="N", help="retries at most (default 5)")
    get.add_argument(
        "--cooldown", metavar="URL", default=None,
        help="shared cooldown store: memory:// (default), sqlite:///file or redis://host",
    )  # fmt: skip
    get.add_argument(
        "-H", "--header", type=_header, action="append", default=[], metavar="'K: V'",
        help="a request header (repeatable); its value is never printed",
    )  # fmt: skip
    get.add_argument("--method", type=_method, default="GET", help="HTTP method (default GET)")
    get.add_argument(
        "--timeout", type=_positive_seconds, default=30.0, metavar="S",
        help="socket timeout per attempt in seconds (default 30; clamped to the deadline)",
    )  # fmt: skip

    explain = commands.add_parser(
        "explain",
        help="show how a Retry-After value is parsed and what the policy would decide",
        description="Parse a Retry-After value the way the adapter does, and show the decision\n"
        "(retry after a wait, or defer) for the given budget.",
        epilog=EXPLAIN_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    explain.add_argument("value", metavar="VALUE", help="the Retry-After value, e.g. 120 or an HTTP-date")
    explain.add_argument(
        "--date", default=None, metavar="HTTP-DATE", help="the response's Date header, if any"
    )
    explain.add_argument(
        "--deadline", type=_seconds_or_none, default=None, metavar="S",
        help="the call's deadline in seconds (default: none)",
    )  # fmt: skip
    explain.add_argument(
        "--max-wait", type=_seconds_or_none, default=60.0, metavar="S",
        help="longest single wait in seconds (default 60; 'none' for no limit)",
    )  # fmt: skip
    explain.add_argument(
        "--max-retry-after", type=_seconds_or_none, default=DEFAULT_MAX_RETRY_AFTER, metavar="S",
        help=f"longest Retry-After obeyed; a longer one is rejected like an invalid value "
        f"(default {DEFAULT_MAX_RETRY_AFTER:g}; 'none' for no bound)",
    )  # fmt: skip
    explain.add_argument(
        "--elapsed", type=_seconds, default=0.0, metavar="S",
        help="seconds the call has used already (default 0)",
    )  # fmt: skip
    explain.add_argument(
        "--backoff", type=_seconds, default=0.0, metavar="S",
        help="the local backoff in seconds at this retry (default 0)",
    )  # fmt: skip
    explain.add_argument(
        "--received-at", type=_aware_time, default=None, metavar="ISO",
        help="when the response was received, ISO 8601 with offset (default: now)",
    )  # fmt: skip
    explain.add_argument("--json", action="store_true", help="print the explanation as JSON")

    status = commands.add_parser(
        "status",
        help="list the cooldowns a shared store holds (scope, eligible time, seconds left)",
        description="List the cooldowns stored in a shared SQLite or Redis store: the operator's\n"
        "view of who is held back, and until when.",
        epilog=STATUS_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    status.add_argument("--cooldown", required=True, metavar="URL", help="sqlite:///file or redis://host")
    status.add_argument("--all", action="store_true", help="include cooldowns that have already ended")
    status.add_argument("--json", action="store_true", help="print the cooldowns as JSON")

    clear = commands.add_parser(
        "clear",
        help="lift one scope's stored cooldown",
        description="Remove one scope's cooldown from a shared store (after an absurd or mistaken\n"
        "Retry-After, say). Processes whose store answers see it at their next attempt.",
        epilog=STATUS_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    clear.add_argument("scope", metavar="SCOPE", help="the scope, exactly as 'status' shows it")
    clear.add_argument("--cooldown", required=True, metavar="URL", help="sqlite:///file or redis://host")
    return parser


# --------------------------------------------------------------------------- demo
def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import DemoConfig, format_report, report_json, run_demo
    from .errors import ConfigurationError

    try:
        config = DemoConfig(
            workers=args.workers,
            items=args.items,
            quota=args.quota,
            window=args.window,
            deadline=args.deadline,
            form=args.form,
        )
    except ConfigurationError as exc:
        _err(f"error: {exc}")
        return EX_USAGE
    human: IO[str] = sys.stderr if args.json else sys.stdout
    _progress(
        f"Running {config.workers} workers over {config.items} items, first with stock urllib3 Retry, "
        f"then with RetryAfterAdapter (each run stops by itself within {config.limit:g} s)..."
    )
    results = run_demo(config, progress=_progress)
    human.write(format_report(results, config) + "\n")
    human.flush()
    if args.json:
        sys.stdout.write(report_json(results, config) + "\n")
        sys.stdout.flush()
    return EX_OK


def _progress(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


# --------------------------------------------------------------------------- get
def _cmd_get(args: argparse.Namespace) -> int:
    import requests

    from .adapter import DEFAULT_STORE, RetryAfterAdapter
    from .deferral import deferral_of
    from .errors import ConfigurationError, RetryAfterError, RetryDeferred
    from .observe import DecisionRecord
    from .policy import STOP, Reason
    from .retry import RetryAfterRetry

    url: str = args.url
    shown = safe_url(url)
    for part in _url_secrets(url):
        _redact.add(part)
    headers: dict[str, str] = {}
    for name, value in args.header:
        _redact.add(value)
        headers[name] = value
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError:
        _err(f"error: not a valid URL: {shown}")
        return EX_USAGE
    if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
        _err(f"error: not an http:// or https:// URL: {shown}")
        return EX_USAGE

    try:
        store = _store(args.cooldown, DEFAULT_STORE)
    except (ConfigurationError, ImportError) as exc:
        _err(f"error: --cooldown: {exc}")
        return EX_USAGE

    stops: list[str] = []

    def note(record: DecisionRecord) -> None:
        if record.action == STOP and record.reason:
            stops.append(record.reason)

    try:
        retry = RetryAfterRetry(
            total=args.retries,
            deadline=args.deadline,
            max_wait=args.max_wait,
            backoff_factor=0.5,
            raise_on_status=False,
            on_decision=note,
        )
    except ConfigurationError as exc:
        _err(f"error: {exc}")
        return EX_USAGE
    session = requests.Session()
    adapter = RetryAfterAdapter(max_retries=retry, cooldown=store)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    try:
        response = session.request(args.method, url, headers=headers, timeout=args.timeout)
    except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
        # Also when the last attempt's error carries a deferral: the server is unreachable.
        _err(f"cannot reach {shown}: {_transport_reason(exc)}")
        return EX_UNAVAILABLE
    except RetryDeferred as exc:
        return _print_deferral(exc.deferral)
    except requests.exceptions.InvalidURL:
        _err(f"error: not a valid URL: {shown}")
        return EX_USAGE
    except (requests.exceptions.MissingSchema, requests.exceptions.InvalidSchema):
        _err(f"error: not an http:// or https:// URL: {shown}")
        return EX_USAGE
    except (requests.exceptions.ChunkedEncodingError, requests.exceptions.ContentDecodingError) as exc:
        _err(f"the response from {shown} broke off: {_transport_reason(exc)}")
        return EX_UNAVAILABLE
    except requests.exceptions.TooManyRedirects:
        _err(f"too many redirects from {shown}")
        return EX_FAILED
    except RetryAfterError as exc:
        _err(f"{type(exc).__name__}: {exc}")
        return EX_FAILED
    except requests.exceptions.RequestException as exc:
        _err(f"request to {shown} failed: {type(exc).__name__}")
        return EX_FAILED
    finally:
        session.close()

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
    _err(f"HTTP {response.status_code} from {shown} (stop_reason: {reason})")
    return EX_FAILED


def _store(text: str | None, default: Any) -> Any:
    """The cooldown store ``--cooldown`` names; ``memory://`` (or nothing) is the process
    default store."""
    if text is None or text.strip().lower() == "memory://":
        return default
    for part in _url_secrets(text):
        _redact.add(part)
    from .cooldown import store_from_url

    return store_from_url(text)


def _print_deferral(deferral: Any) -> int:
    sys.stdout.write(json.dumps(deferral.to_dict(), sort_keys=True) + "\n")
    sys.stdout.flush()
    _err(
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


# --------------------------------------------------------------------------- explain
def _cmd_explain(args: argparse.Namespace) -> int:
    from .errors import InvalidRetryAfter
    from .header import parse_http_date, parse_retry_after
    from .policy import DEFER, TOO_LONG, beyond_bound, decide

    value: str = args.value
    received_at: datetime = args.received_at or datetime.now(timezone.utc)
    received_note = "" if args.received_at else " (now)"
    policy = {
        "deadline": args.deadline,
        "max_wait": args.max_wait,
        "elapsed": args.elapsed,
        "backoff": args.backoff,
        "max_retry_after": args.max_retry_after,
    }
    date_valid: bool | None = None
    if args.date is not None:
        try:
            parse_http_date(args.date, received_at=received_at)
            date_valid = True
        except InvalidRetryAfter:
            date_valid = False
    try:
        parsed = parse_retry_after(value, received_at=received_at, date=args.date)
        if beyond_bound(parsed.delay, args.max_retry_after):
            raise InvalidRetryAfter(TOO_LONG, value)
    except InvalidRetryAfter as exc:
        stop_reason = "retry_after_too_long" if exc.reason == TOO_LONG else "invalid_retry_after"
        fallback = decide(
            server_delay=None,
            backoff=args.backoff,
            cooldown_left=0.0,
            jitter=0.0,
            elapsed=args.elapsed,
            deadline=args.deadline,
            max_wait=args.max_wait,
        )
        consequence = "the adapter would stop (on_invalid='stop') or use local backoff (on_invalid='backoff')"
        details = (
            f"stop: no retry, the response is returned with stop_reason '{stop_reason}'; "
            f"backoff: {_describe_action(fallback.action, fallback.reason, fallback.wait)} "
            f"(local backoff {_secs(args.backoff)})"
        )
        if args.json:
            _print_json(
                {
                    "value": value,
                    "valid": False,
                    "reason": exc.reason,
                    "error": str(exc),
                    "received_at": received_at.isoformat(),
                    "date": args.date,
                    "date_valid": date_valid,
                    "policy": policy,
                    "on_invalid": {
                        "stop": {"action": "stop", "reason": stop_reason},
                        "backoff": _decision_dict(fallback, received_at),
                    },
                    "consequence": consequence,
                    "details": details,
                }
            )
        else:
            print(f"Retry-After: {_show(value)}")
            print(f"  invalid       {exc.reason}: {_REASONS.get(exc.reason, str(exc))}")
            print(f"  consequence   {consequence}")
            print(f"                {details}")
        return EX_FAILED

    decision = decide(
        server_delay=parsed.delay,
        backoff=args.backoff,
        cooldown_left=0.0,
        jitter=0.0,
        elapsed=args.elapsed,
        deadline=args.deadline,
        max_wait=args.max_wait,
    )
    decided_at = _plus(received_at, decision.wait)
    if args.json:
        _print_json(
            {
                "value": value,
                "valid": True,
                "form": parsed.form,
                "delay": parsed.delay,
                "received_at": received_at.isoformat(),
                "eligible_at": parsed.eligible_at.isoformat(),
                "clock_skew": parsed.clock_skew,
                "date": args.date,
                "date_valid": date_valid,
                "policy": policy,
                "decision": _decision_dict(decision, received_at),
            }
        )
        return EX_OK

    print(f"Retry-After: {_show(value)}")
    print(f"  form          {'delay-seconds' if parsed.form == 'seconds' else 'HTTP-date'} ({parsed.form})")
    print(f"  received at   {received_at.isoformat()}{received_note}")
    if args.date is not None:
        if date_valid:
            print(f"  server Date   {_show(args.date)}: {_skew_text(parsed.clock_skew)}")
        else:
            print(f"  server Date   {_show(args.date)}: invalid, ignored")
    if parsed.form == "date":
        basis = "the server's Date" if parsed.clock_skew is not None else "the receipt time"
        print(f"  delay         {_secs(parsed.delay)} (measured against {basis})")
    else:
        print(f"  delay         {_secs(parsed.delay)}")
    print(f"  eligible at   {parsed.eligible_at.isoformat()}")
    print(
        f"  policy        max_wait {_limit(args.max_wait)}, deadline {_limit(args.deadline)}, "
        f"elapsed {_secs(args.elapsed)}, local backoff {_secs(args.backoff)}"
    )
    if decision.action == DEFER:
        if decision.reason == "max_wait":
            why = f"the wait of {_secs(decision.wait)} is longer than max_wait {_limit(args.max_wait)}"
        else:
            why = (
                f"elapsed {_secs(args.elapsed)} + wait {_secs(decision.wait)} is past the deadline "
                f"{_limit(args.deadline)}"
            )
        print(f"  decision      defer ({decision.reason}): {why}")
        when = decided_at.isoformat()
        print(f"                the call returns at once with a deferral; nothing is sent before {when}")
    else:
        print(f"  decision      retry after {_secs(decision.wait)} (at {decided_at.isoformat()})")
    return EX_OK


_REASONS = {
    "beyond_max": "the wait is longer than --max-retry-after: rejected, never obeyed or shortened",
    "empty": "the value is empty",
    "too_long": "the value is longer than 128 characters",
    "control": "the value contains a control character",
    "repeated": "a list or repeated field (only one value is allowed)",
    "malformed": "neither delay-seconds (ASCII digits) nor an HTTP-date",
    "zone": "an HTTP-date must be in GMT",
    "out_of_range": "no such date or time",
    "weekday": "the day name does not match the date",
    "type": "not a string",
}


def _decision_dict(decision: Any, received_at: datetime) -> dict[str, Any]:
    return {
        "action": decision.action,
        "reason": decision.reason,
        "wait": decision.wait,
        "eligible_at": _plus(received_at, decision.wait).isoformat(),
    }


def _describe_action(action: str, reason: str | None, wait: float) -> str:
    if action == "retry":
        return f"retry after {_secs(wait)}"
    return f"{action} ({reason}) for {_secs(wait)}"


def _plus(moment: datetime, seconds: float) -> datetime:
    try:
        return moment + timedelta(seconds=seconds)
    except OverflowError:
        return datetime.max.replace(tzinfo=timezone.utc)


def _secs(value: float) -> str:
    return f"{value:g} s"


def _limit(value: float | None) -> str:
    return "none" if value is None else _secs(value)


def _skew_text(skew: float | None) -> str:
    if skew is None:
        return "no clock skew measured"
    if skew == 0:
        return "the local clock agrees with the server (skew 0 s)"
    side = "ahead of" if skew > 0 else "behind"
    return f"the local clock is {abs(skew):g} s {side} the server (skew {skew:+g} s)"


def _show(value: str) -> str:
    """A value as a quoted, escaped string, shortened past 200 characters."""
    text = json.dumps(value[:200], ensure_ascii=True)
    return text + (" (shortened)" if len(value) > 200 else "")


def _print_json(data: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    sys.stdout.flush()


# --------------------------------------------------------------------------- status, clear
def _shared_store(text: str) -> tuple[Any, int]:
    """The store ``--cooldown`` names for ``status`` and ``clear``, or (after an error
    message) None and the exit code: not a shared store, or unavailable."""
    from .errors import ConfigurationError, CooldownStoreError

    if text.strip().lower().startswith("memory:"):
        _err("error: --cooldown: memory:// lives inside one process; use sqlite:// or redis://")
        return None, EX_USAGE
    try:
        return _store(text, None), EX_OK
    except (ConfigurationError, ImportError) as exc:
        _err(f"error: --cooldown: {exc}")
        return None, EX_USAGE
    except CooldownStoreError as exc:
        _err(f"error: {exc}")
        return None, EX_UNAVAILABLE


def _cmd_status(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from .cooldown.base import Hold
    from .cooldown.freshness import Freshness
    from .errors import CooldownStoreError

    store, code = _shared_store(args.cooldown)
    if store is None:
        return code
    now = datetime.now(timezone.utc)
    try:
        entries = store.entries()
        fresh: dict[str, Freshness] = store.freshness_entries() if hasattr(store, "freshness_entries") else {}
        holds: dict[str, list[Hold]] = store.holds(now) if hasattr(store, "holds") else {}
    except CooldownStoreError as exc:
        _err(f"error: {_plain(exc)}")
        return EX_UNAVAILABLE
    for scope, until in entries.items():
        fresh.setdefault(scope, Freshness(next_eligible=until))
    for scope, held in holds.items():
        # Every kind of block counts for when the scope is eligible again.
        ends = [hold.until for hold in held if hold.kind != "leases"]
        record = fresh.setdefault(scope, Freshness())
        if ends and (record.next_eligible is None or max(ends) > record.next_eligible):
            fresh[scope] = replace(record, next_eligible=max(ends))
    epoch = datetime.min.replace(tzinfo=timezone.utc)
    rows = sorted(
        (
            (scope, record)
            for scope, record in fresh.items()
            if args.all or (record.next_eligible is not None and record.next_eligible > now)
        ),
        key=lambda row: (row[1].next_eligible or epoch, row[1].last_success or epoch, row[0]),
        reverse=True,
    )
    if args.json:
        _print_json(
            {
                "now": now.isoformat(),
                "cooldowns": [
                    {
                        "scope": scope,
                        "eligible_at": _iso(record.next_eligible),
                        "seconds_left": round(max(0.0, (record.next_eligible - now).total_seconds()), 3)
                        if record.next_eligible is not None
                        else 0.0,
                        "last_success": _iso(record.last_success),
                        "seconds_since_success": None
                        if record.last_success is None
                        else round(record.seconds_since_success(now) or 0.0, 3),
                        "last_error": record.last_error,
                        "last_error_at": _iso(record.last_error_at),
                        "held_by": [
                            {"kind": hold.kind, "until": _iso(hold.until), "number": hold.number}
                            for hold in holds.get(scope, [])
                        ],
                    }
                    for scope, record in rows
                ],
            }
        )
        return EX_OK
    if not rows:
        print("no cooldown is running" if not args.all else "nothing is stored")
        return EX_OK
    width = max(len("scope"), *(len(scope) for scope, _ in rows))
    print(
        f"{'scope':<{width}}  {'eligible at (UTC)':<25}  {'left':<8}  {'held by':<18}  "
        f"{'last success':<14}  last error"
    )
    for scope, record in rows:
        until = record.next_eligible
        left = max(0.0, (until - now).total_seconds()) if until is not None else 0.0
        shown = f"{left:.1f} s" if left else ("ended" if until is not None else "-")
        eligible = until.isoformat(timespec="seconds") if until is not None else "-"
        since = record.seconds_since_success(now)
        success = "never" if since is None else f"{_ago(since)} ago"
        error = "-"
        if record.last_error is not None and record.last_error_at is not None:
            error = f"{record.last_error}, {_ago(max(0.0, (now - record.last_error_at).total_seconds()))} ago"
        kinds = ",".join(sorted({hold.kind for hold in holds.get(scope, [])})) or "-"
        print(f"{scope:<{width}}  {eligible:<25}  {shown:<8}  {kinds:<18}  {success:<14}  {error}")
    return EX_OK


def _iso(when: datetime | None) -> str | None:
    return None if when is None else when.isoformat()


def _ago(seconds: float) -> str:
    """A duration for a person: 4.2 s, 12 min, 3.5 h, 2.0 d."""
    if seconds < 90:
        return f"{seconds:.1f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _cmd_clear(args: argparse.Namespace) -> int:
    from .errors import ConfigurationError, CooldownStoreError

    store, code = _shared_store(args.cooldown)
    if store is None:
        return code
    scope: str = args.scope
    try:
        held = store.holds().get(scope, []) if hasattr(store, "holds") else []
        until = store.get(scope)
        removed = store.delete(scope)
        nearest = [] if removed else _nearest(store, scope)
    except ConfigurationError as exc:
        _err(f"error: {exc}")
        return EX_USAGE
    except CooldownStoreError as exc:
        _err(f"error: {_plain(exc)}")
        return EX_UNAVAILABLE
    if not removed:
        hint = f"; stored scopes like it: {', '.join(nearest)}" if nearest else ""
        _err(f"nothing is stored for {scope}{hint}")
        return EX_FAILED
    others = sorted({hold.kind for hold in held} - {"cooldown"})
    ran = f" (it ran until {until.isoformat()})" if until is not None else ""
    also = f"; also lifted: {', '.join(others)}" if others else ""
    what = "the cooldown of " if until is not None else "what holds back "
    print(f"cleared {what}{scope}{ran}{also}")
    return EX_OK


def _nearest(store: Any, scope: str) -> list[str]:
    """Stored scopes that the one asked for names in part (an origin without its port,
    a scheme less): what the operator most likely meant."""
    known = set(store.entries())
    if hasattr(store, "holds"):
        known |= set(store.holds())
    if hasattr(store, "freshness_entries"):
        known |= set(store.freshness_entries())
    bare = scope.rstrip("/")
    return sorted(k for k in known if bare and (k.startswith(bare) or bare.startswith(k)))[:5]


def _plain(exc: BaseException) -> str:
    """A store error for a person: without the package's internal operation names."""
    return re.sub(r" during [a-z_]+", "", str(exc))


# --------------------------------------------------------------------------- main
class _ScrubFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = _redact(record.getMessage()).replace("\n", " ")
        record.args = None
        record.exc_info = None  # one line, no traceback
        record.exc_text = None
        record.levelname = record.levelname.lower()
        return True


def _setup_logging() -> None:
    """The package's warnings (a failing cooldown store, say) as one scrubbed stderr line."""
    logger = logging.getLogger("retry_after_adapter")
    if logger.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{PROG}: %(levelname)s: %(message)s"))
    handler.addFilter(_ScrubFilter())
    handler.setLevel(logging.WARNING)
    logger.addHandler(handler)
    logger.propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see the module's docstring)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    _redact.learn_argv(arguments)
    _setup_logging()
    parser = build_parser()
    args = parser.parse_args(arguments)
    handlers = {
        "demo": _cmd_demo,
        "get": _cmd_get,
        "explain": _cmd_explain,
        "status": _cmd_status,
        "clear": _cmd_clear,
    }
    if args.command is None:
        parser.print_help(sys.stderr)
        return EX_USAGE
    try:
        return handlers[args.command](args)
    except KeyboardInterrupt:
        _err("interrupted")
        return EX_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, without a flush error at exit.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EX_FAILED
    except Exception as exc:  # one line, never a traceback (messages are scrubbed)
        _err(f"unexpected error: {type(exc).__name__}: {exc}")
        return EX_FAILED


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
