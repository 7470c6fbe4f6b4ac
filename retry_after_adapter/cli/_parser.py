"""The command line's argument parser: the argument types, the help texts, the options
of every command. Argument errors are one line (exit 2), scrubbed of secrets."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, NoReturn

from .. import __version__
from ._output import EX_USAGE, PROG, redactor

_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_METHOD = re.compile(r"[A-Z]+")

#: ``get``'s default deadline in seconds: an unreachable host or a slow server costs a
#: cron job at most this long (``--deadline none`` lifts it).
DEFAULT_GET_DEADLINE = 10.0

#: ``explain``'s and ``get``'s bound on one Retry-After (the policy's default, a day).
DEFAULT_MAX_RETRY_AFTER = 86_400.0


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (exit 2), scrubbed of secrets."""

    def error(self, message: str) -> NoReturn:
        line = redactor(message).replace("\n", " ")
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


#: Each command: its line in the overview, its description, its epilog.
_COMMANDS: dict[str, tuple[str, str, str]] = {
    "demo": (
        "compare stock urllib3 Retry with RetryAfterAdapter on a local throttling server",
        "Run a fleet of workers through a local throttling server twice: with stock\n"
        "urllib3 Retry, then with RetryAfterAdapter and a shared cooldown, and print a\n"
        "side-by-side table.",
        DEMO_EPILOG,
    ),
    "get": (
        "fetch a URL under the policy; exit 75 with a JSON deferral when deferred",
        "Fetch URL with RetryAfterAdapter. On success print the body; when the server's\n"
        "wait does not fit the budget, print the deferral as JSON and exit 75.",
        GET_EPILOG,
    ),
    "explain": (
        "show how a Retry-After value is parsed and what the policy would decide",
        "Parse a Retry-After value the way the adapter does, and show the decision\n"
        "(retry after a wait, or defer) for the given budget.",
        EXPLAIN_EPILOG,
    ),
    "status": (
        "list the cooldowns a shared store holds (scope, eligible time, seconds left)",
        "List the cooldowns stored in a shared SQLite or Redis store: the operator's\n"
        "view of who is held back, and until when.",
        STATUS_EPILOG,
    ),
    "clear": (
        "lift one scope's stored cooldown",
        "Remove one scope's cooldown from a shared store (after an absurd or mistaken\n"
        "Retry-After, say). Processes whose store answers see it at their next attempt.",
        STATUS_EPILOG,
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the command line (every command)."""
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
    options = {
        "demo": _demo_options,
        "get": _get_options,
        "explain": _explain_options,
        "status": _status_options,
        "clear": _clear_options,
    }
    for name, (summary, description, epilog) in _COMMANDS.items():
        command = commands.add_parser(
            name,
            help=summary,
            description=description,
            epilog=epilog,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        options[name](command)
    return parser


def _demo_options(demo: argparse.ArgumentParser) -> None:
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


def _get_options(get: argparse.ArgumentParser) -> None:
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


#: ``explain``'s budget options, all in seconds: flag, argument type, default, help.
_EXPLAIN_BUDGET: tuple[tuple[str, Callable[[str], float | None], float | None, str], ...] = (
    ("--deadline", _seconds_or_none, None, "the call's deadline in seconds (default: none)"),
    (
        "--max-wait",
        _seconds_or_none,
        60.0,
        "longest single wait in seconds (default 60; 'none' for no limit)",
    ),
    (
        "--max-retry-after",
        _seconds_or_none,
        DEFAULT_MAX_RETRY_AFTER,
        f"longest Retry-After obeyed; a longer one is rejected like an invalid value "
        f"(default {DEFAULT_MAX_RETRY_AFTER:g}; 'none' for no bound)",
    ),
    ("--elapsed", _seconds, 0.0, "seconds the call has used already (default 0)"),
    ("--backoff", _seconds, 0.0, "the local backoff in seconds at this retry (default 0)"),
)


def _explain_options(explain: argparse.ArgumentParser) -> None:
    explain.add_argument("value", metavar="VALUE", help="the Retry-After value, e.g. 120 or an HTTP-date")
    explain.add_argument(
        "--date", default=None, metavar="HTTP-DATE", help="the response's Date header, if any"
    )
    for flag, parse, default, text in _EXPLAIN_BUDGET:
        explain.add_argument(flag, type=parse, default=default, metavar="S", help=text)
    explain.add_argument(
        "--received-at", type=_aware_time, default=None, metavar="ISO",
        help="when the response was received, ISO 8601 with offset (default: now)",
    )  # fmt: skip
    explain.add_argument("--json", action="store_true", help="print the explanation as JSON")


def _status_options(status: argparse.ArgumentParser) -> None:
    _shared_store_option(status)
    status.add_argument("--all", action="store_true", help="include cooldowns that have already ended")
    status.add_argument("--json", action="store_true", help="print the cooldowns as JSON")


def _clear_options(clear: argparse.ArgumentParser) -> None:
    clear.add_argument("scope", metavar="SCOPE", help="the scope, exactly as 'status' shows it")
    _shared_store_option(clear)


def _shared_store_option(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--cooldown", required=True, metavar="URL",
        help="sqlite:///file, redis://host, or module:factory (a store of your own with Listing)",
    )
