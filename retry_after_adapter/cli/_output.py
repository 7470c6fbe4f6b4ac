"""What every command shares: exit codes, the one redactor, stderr lines, JSON on
stdout, the package's warnings as scrubbed lines, and the store ``--cooldown`` names.

Every secret the command line meets (a header value, a URL's query string, fragment
or user info) is added to :data:`redactor` before anything can print it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Sequence
from typing import Any

from ..redact import Redactor, argument_secrets, redact

EX_OK = 0
EX_FAILED = 1
EX_USAGE = 2
EX_UNAVAILABLE = 69
EX_TEMPFAIL = 75
EX_INTERRUPTED = 130

PROG = "retry-after-adapter"

#: Removes every secret seen so far from printed text.
redactor = Redactor()

#: Options whose value is never a header (dates and times contain colons too).
_VALUE_OPTIONS = frozenset({"--date", "--received-at", "--cooldown", "--method"})
_HEADER_LIKE = re.compile(r"[A-Za-z][A-Za-z0-9_-]*:(?!//).*", re.DOTALL)


def learn_argv(argv: Sequence[str]) -> None:
    """Collect every header value and query string that appears on the command line,
    before parsing, so that even argparse's own error messages are scrubbed."""
    previous = ""
    for token in argv:
        if previous in ("--header", "-H"):
            _add_header_token(token)
        elif token.startswith("--header="):
            _add_header_token(token.partition("=")[2])
        elif token.startswith("-H") and len(token) > 2:
            _add_header_token(token[2:])
        elif previous not in _VALUE_OPTIONS and _HEADER_LIKE.fullmatch(token) is not None:
            # "Name: value" given in the wrong place (after a mistyped option, say).
            _add_header_token(token)
        redactor.add_all(argument_secrets(token))
        previous = token


def _add_header_token(token: str) -> None:
    _, sep, value = token.partition(":")
    redactor.add(value if sep else token)


def err(message: str) -> None:
    """One line on stderr, prefixed with the program name and scrubbed of secrets."""
    line = redact(redactor(message)).replace("\n", " ").strip()
    sys.stderr.write(f"{PROG}: {line}\n")
    sys.stderr.flush()


def print_json(data: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    sys.stdout.flush()


#: ``module:factory`` (``--cooldown``): a store of one's own, made by calling ``factory()``.
_FACTORY = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")
#: What starts a store URL: ``sqlite:x.db`` is a mistyped URL, not a module ``sqlite``.
_URL_SCHEMES = frozenset({"memory", "sqlite", "redis", "rediss", "valkey", "valkeys"})


def open_store(text: str | None, default: Any, *, create: bool = True) -> Any:
    """The cooldown store ``--cooldown`` names: a URL (``sqlite:///file``,
    ``redis://host``), or ``module:factory``, a store of one's own that
    ``factory()`` returns (the module imported from the working directory first, as a
    web server's ``module:app``); ``memory://`` (or nothing) is the process default
    store. ``create=False``: only a store that exists (``status``, ``clear``)."""
    if text is None or text.strip().lower() == "memory://":
        return default
    if _FACTORY.fullmatch(text.strip()) and text.partition(":")[0].lower() not in _URL_SCHEMES:
        return _from_factory(text.strip())
    redactor.add_all(argument_secrets(text))
    from ..cooldown import store_from_url

    return store_from_url(text, create=create)


def _from_factory(text: str) -> Any:
    """The store ``factory()`` of ``module:factory`` returns; a ConfigurationError that
    names what is wrong (no such module or factory, not a store)."""
    import importlib

    from ..cooldown.base import Store
    from ..errors import ConfigurationError, failure_cause

    module_name, _, attribute = text.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    # What the module or the factory raise is told by its kind only: their messages may
    # hold the credentials the store is made with (a URL, a password).
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:  # its module's name is all it says
        raise ConfigurationError(
            f"cannot import {module_name!r} for {text}: no module named {exc.name!r}"
        ) from None
    except Exception as exc:
        raise ConfigurationError(
            f"cannot import {module_name!r} for {text}: {failure_cause(exc)[0]} (its message is not shown)"
        ) from None
    factory: Any = module
    for part in attribute.split("."):
        if part not in vars(factory):
            raise ConfigurationError(f"{module_name!r} has no {attribute!r} ({text})")
        factory = vars(factory)[part]
    if not callable(factory):
        raise ConfigurationError(f"{text} is not callable: it must make the store")
    try:
        store = factory()
    except Exception as exc:
        raise ConfigurationError(
            f"{text} failed to make the store: {failure_cause(exc)[0]} (its message is not shown)"
        ) from None
    if not isinstance(store, Store):
        raise ConfigurationError(
            f"{text} returned {type(store).__name__}, not a retry_after_adapter Store"
        )
    return store


class _ScrubFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.msg = redactor(record.getMessage()).replace("\n", " ")
        record.args = None
        record.exc_info = None  # one line, no traceback
        record.exc_text = None
        record.levelname = record.levelname.lower()
        return True


def setup_logging() -> None:
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
