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

Layout: ``_output`` holds what every command shares (exit codes, the redactor, stderr
lines, JSON, the store ``--cooldown`` names); ``_parser`` the argument types, help texts
and :func:`build_parser`; ``demo``, ``get``, ``explain`` and ``status`` (with
``clear``) one command group each. The commands import the rest of the package only
when they run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Sequence

from ..redact import safe_url
from ._output import (
    EX_FAILED,
    EX_INTERRUPTED,
    EX_OK,
    EX_TEMPFAIL,
    EX_UNAVAILABLE,
    EX_USAGE,
    PROG,
    err,
    learn_argv,
    setup_logging,
)
from ._parser import (
    DEFAULT_GET_DEADLINE,
    DEFAULT_MAX_RETRY_AFTER,
    DEMO_EPILOG,
    EXPLAIN_EPILOG,
    GET_EPILOG,
    STATUS_EPILOG,
    build_parser,
)
from .demo import cmd_demo
from .explain import cmd_explain
from .get import cmd_get
from .status import cmd_clear, cmd_status

__all__ = [
    "DEFAULT_GET_DEADLINE",
    "DEFAULT_MAX_RETRY_AFTER",
    "DEMO_EPILOG",
    "EXPLAIN_EPILOG",
    "EX_FAILED",
    "EX_INTERRUPTED",
    "EX_OK",
    "EX_TEMPFAIL",
    "EX_UNAVAILABLE",
    "EX_USAGE",
    "GET_EPILOG",
    "PROG",
    "STATUS_EPILOG",
    "build_parser",
    "main",
    "safe_url",
]

_HANDLERS: dict[str, Callable[[argparse.Namespace], int]] = {
    "demo": cmd_demo,
    "get": cmd_get,
    "explain": cmd_explain,
    "status": cmd_status,
    "clear": cmd_clear,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (see the module's docstring)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    learn_argv(arguments)
    setup_logging()
    parser = build_parser()
    args = parser.parse_args(arguments)
    if args.command is None:
        parser.print_help(sys.stderr)
        return EX_USAGE
    try:
        return _HANDLERS[args.command](args)
    except KeyboardInterrupt:
        err("interrupted")
        return EX_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, without a flush error at exit.
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EX_FAILED
    except Exception as exc:  # one line, never a traceback (messages are scrubbed)
        err(f"unexpected error: {type(exc).__name__}: {exc}")
        return EX_FAILED
