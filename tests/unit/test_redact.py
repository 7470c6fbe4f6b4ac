"""Redaction: every way a URL, a log line or a message is cleaned of credentials."""

from __future__ import annotations

import ast
import logging
import sys
from pathlib import Path

import pytest

from retry_after_adapter import observe, scope
from retry_after_adapter.redact import (
    MASK,
    RedactingFilter,
    Redactor,
    argument_secrets,
    client_secrets,
    redact,
    redact_url,
    safe_url,
    scrub,
    strip_query,
    url_secrets,
)

from ..conftest import remove_log_redaction


def test_the_old_homes_still_export_the_same_objects() -> None:
    assert scope.strip_query is strip_query
    assert observe.redact is redact
    assert observe.RedactingFilter is RedactingFilter
    try:
        assert isinstance(observe.redact_urllib3_logs(), RedactingFilter)
    finally:
        remove_log_redaction()


def test_redact_imports_nothing_of_the_package() -> None:
    import retry_after_adapter.redact as module

    tree = ast.parse(Path(module.__file__ or "").read_text(encoding="utf-8"))
    imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [
        alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    ]
    assert imported and all(
        name in ("__future__", "logging", "re", "collections.abc", "typing", "urllib.parse")
        for name in imported
    ), imported


# --------------------------------------------------------------------------- strip_query
@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://h/p?token=abc", "https://h/p"),
        ("https://h/p#frag", "https://h/p"),
        ("https://h/p?a=1#f", "https://h/p"),
        ("https://h/p#f?a=1", "https://h/p"),
        ("https://h/p", "https://h/p"),
        ("/items?page=2", "/items"),
        ("?only", ""),
        ("", ""),
        # user info is not strip_query's concern: urllib3 hands it a path
        ("https://u:pw@h/p?q", "https://u:pw@h/p"),
    ],
)
def test_strip_query_cuts_the_query_and_the_fragment(url: str, expected: str) -> None:
    assert strip_query(url) == expected


def test_strip_query_of_none_is_none_and_a_clean_url_is_the_same_object() -> None:
    assert strip_query(None) is None
    url = "https://h/p"
    assert strip_query(url) is url


# --------------------------------------------------------------------------- safe_url
@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://api.example.com/v1/x?api_key=s3cret", "https://api.example.com/v1/x"),
        ("https://user:pa55@api.example.com/v1/x#frag", "https://api.example.com/v1/x"),
        ("https://user:p@ss@api.example.com:8443/x", "https://api.example.com:8443/x"),
        ("https://api.example.com/users/@me", "https://api.example.com/users/@me"),
        ("not a url?x=s3cret#frag", "not a url"),
        ("not a url#frag?x", "not a url"),
        ("http:///nohost?x=1", "http:///nohost"),
        ("http://[::1", "<unparseable URL>"),
    ],
)
def test_safe_url_drops_user_info_query_and_fragment(url: str, expected: str) -> None:
    assert safe_url(url) == expected


# --------------------------------------------------------------------------- redact_url
@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://:s3cret@localhost:6379/0", "redis://***@localhost:6379/0"),
        ("redis://user:s3cret@cache:6379/2?ssl=true#x", "redis://***@cache:6379/2"),
        # a password holding @, / or ? is cut whole: everything up to the last @
        ("rediss://user:p@ss/w?rd@cache.internal:6380/1", "rediss://***@cache.internal:6380/1"),
        ("redis://localhost:6379/0", "redis://localhost:6379/0"),
        ("sqlite:///cooldown.db?mode=ro", "sqlite:///cooldown.db"),
        ("user:pw@host?q=1", "***@host"),
        ("", ""),
    ],
)
def test_redact_url_masks_user_info_and_drops_query_and_fragment(url: str, expected: str) -> None:
    assert redact_url(url) == expected


def test_redact_url_is_bounded() -> None:
    assert redact_url("redis://h/" + "x" * 500) == ("redis://h/" + "x" * 500)[:200]


# --------------------------------------------------------------------------- redact (free text)
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('"GET /items?token=abc&page=2 HTTP/1.1" 200', '"GET /items?token=***&page=*** HTTP/1.1" 200'),
        ("GET /x?flag&key=v HTTP/1.1", "GET /x?***&key=*** HTTP/1.1"),
        ("GET /x?a=1#frag", "GET /x?a=***#frag"),
        ("url='https://h/p?sig=xyz' done", "url='https://h/p?sig=***' done"),
        ("GET /x? HTTP/1.1", "GET /x? HTTP/1.1"),
        ("https://bob:hunter2@example.com/x", "https://***@example.com/x"),
        ("redis://:pw@cache:6379 and http://u:p@h", "redis://***@cache:6379 and http://***@h"),
        ("mail bob@example.com", "mail bob@example.com"),
        ("no secrets here", "no secrets here"),
    ],
)
def test_redact_masks_query_values_and_user_info(text: str, expected: str) -> None:
    assert redact(text) == expected


def _record(msg: str, *args: object) -> logging.LogRecord:
    return logging.LogRecord("urllib3.connectionpool", logging.DEBUG, __file__, 1, msg, args, None)


def test_redacting_filter_masks_the_message_and_drops_its_args() -> None:
    record = _record('%s "GET %s HTTP/1.1" %s', "https://h:443", "/x?token=abc", 200)
    assert RedactingFilter().filter(record) is True
    assert record.getMessage() == 'https://h:443 "GET /x?token=*** HTTP/1.1" 200'
    assert record.args is None


def test_redacting_filter_leaves_a_clean_record_alone() -> None:
    record = _record("Starting new HTTPS connection (%d): %s:%s", 1, "h", 443)
    RedactingFilter().filter(record)
    assert record.msg == "Starting new HTTPS connection (%d): %s:%s"
    assert record.args == (1, "h", 443)


def test_redacting_filter_masks_the_traceback_and_the_stack() -> None:
    try:
        raise ValueError("bad https://u:pw@h/x?token=abc")
    except ValueError:
        record = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed", None, sys.exc_info())
    record.stack_info = "Stack: GET /y?k=secretvalue"
    RedactingFilter().filter(record)
    assert record.exc_info is None
    assert record.exc_text is not None
    assert "pw" not in record.exc_text and "token=abc" not in record.exc_text
    assert "https://***@h/x?token=***" in record.exc_text
    assert record.stack_info == "Stack: GET /y?k=***"


def test_redacting_filter_lets_a_broken_format_through() -> None:
    record = _record("%d items", "not a number")
    assert RedactingFilter().filter(record) is True
    assert record.msg == "%d items"


# --------------------------------------------------------------------------- known secrets
@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://:s3cret@localhost:6379/0", [":s3cret", "s3cret"]),
        ("redis://user:s3cret@localhost/0", ["user:s3cret", "s3cret"]),
        ("redis://user:p@ss/w?rd@cache/0", ["user:p@ss/w?rd", "p@ss/w?rd"]),
        ("redis://onlyuser@cache/0", ["onlyuser"]),
        ("redis://localhost:6379/0?password=x", []),
        ("no scheme:pw@host", []),
    ],
)
def test_url_secrets_are_the_user_info_and_its_password(url: str, expected: list[str]) -> None:
    assert url_secrets(url) == expected


@pytest.mark.parametrize(
    ("argument", "expected"),
    [
        ("https://api.example.com/v1/x?api_key=s3cret", ["api_key=s3cret"]),
        ("https://u:pw@h/p?q=1#frag", ["u:pw", "pw", "q=1#frag", "frag"]),
        ("https://h/p#frag", ["frag"]),
        ("redis://:s3cret@localhost:6379/0", [":s3cret", "s3cret"]),
        ("sqlite:///cooldown.db", []),
        # a path holding @ is no secret: only the authority's user info counts
        ("https://api.example.com/users/@me", []),
        ("httpish-word", []),
        ("--deadline", []),
        ("x=1?y=2", ["y=2"]),
    ],
)
def test_argument_secrets(argument: str, expected: list[str]) -> None:
    assert argument_secrets(argument) == expected


class _Pool:
    def __init__(self, kwargs: object) -> None:
        self.connection_kwargs = kwargs


class _Client:
    def __init__(self, kwargs: object) -> None:
        self.connection_pool = _Pool(kwargs)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"host": "h", "password": "s3cret"}, ["s3cret"]),
        ({"host": "h", "password": None}, []),
        ({"password": ""}, []),
        ({"password": 1234}, []),
        ({}, []),
        (None, []),
    ],
)
def test_client_secrets_are_the_pool_password(kwargs: object, expected: list[str]) -> None:
    assert client_secrets(_Client(kwargs)) == expected


def test_client_secrets_of_something_without_a_pool() -> None:
    assert client_secrets(object()) == []


def test_scrub_masks_the_longest_secret_first_and_any_user_info() -> None:
    text = "AUTH user:s3cret failed at redis://user:s3cret@cache:6379; s3cret seen"
    assert scrub(text, ["s3cret", "user:s3cret"]) == "AUTH *** failed at redis://***@cache:6379; *** seen"
    assert scrub("redis://@cache", []) == "redis://***@cache"
    assert scrub("nothing", ["", "zz"]) == "nothing"


def test_scrub_is_bounded() -> None:
    assert scrub("x" * 400, []) == "x" * 300


def test_redactor_collects_secrets_and_masks_them() -> None:
    redactor = Redactor()
    redactor.add("  Bearer t0ken  ")
    redactor.add("ab")  # too short to look for
    redactor.add_all(argument_secrets("https://u:pw@h/p?api_key=s3cret"))
    assert redactor.secrets == {"Bearer t0ken", "u:pw", "api_key=s3cret"}
    assert (
        redactor("sent Bearer t0ken to https://u:pw@h/p?api_key=s3cret") == "sent *** to https://***@h/p?***"
    )
    assert redactor("ab stays") == "ab stays"


def test_redactor_replaces_a_whole_secret_before_its_parts() -> None:
    redactor = Redactor()
    redactor.add_all(["abc", "abcdef"])
    assert redactor("abcdef abc") == f"{MASK} {MASK}"


@pytest.mark.parametrize(
    ("url", "password"),
    [("redis://user:pa/ss@host:6379/0", "pa/ss"), ("redis://user:p@ss/w?rd@host/1", "p@ss/w?rd")],
)
def test_a_store_password_holding_a_slash_is_one_secret(url: str, password: str) -> None:
    # A store URL's path never holds "@": its user info runs to the last one, so a
    # password with "/" (which cuts urlsplit's authority short) is hidden whole.
    assert password in argument_secrets(url)
    shown = safe_url(url)
    assert shown.startswith("redis://host") and "ss" not in shown and "pa" not in shown


def test_a_web_path_holding_an_at_sign_is_not_a_secret() -> None:
    assert argument_secrets("https://api.example.com/users/@me") == []
    assert safe_url("https://api.example.com/users/@me") == "https://api.example.com/users/@me"
