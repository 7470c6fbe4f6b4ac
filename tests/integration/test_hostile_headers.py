"""Every Retry-After value of the shared corpus, sent by a real loopback server.

The server writes its responses byte for byte on a raw socket (``http.server`` cannot
send arbitrary bytes: it encodes header values as Latin-1 and would refuse the
non-Latin-1 ones), so each value arrives exactly as the corpus spells it: Latin-1
values as Latin-1 bytes, the others as UTF-8 bytes (which a client reads as Latin-1
text, just as invalid). The server shares the test's FakeClock, answers 503 with the
value and a ``Date`` equal to ``RECEIVED_AT``, then 200, and stamps every request with
the fake time, so "no retry before RECEIVED_AT + delay" is checked in server time.

Two kinds of entries cannot arrive as themselves and are skipped with their value
named (the parser-level corpus test covers them): values containing CR or LF (the
transport cuts the header line there) and values over the length limit only because
of leading whitespace (the transport trims it, so a shorter, different value arrives).
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from itertools import pairwise
from typing import Any

import pytest
import requests

from retry_after_adapter import FakeClock, MemoryCooldownStore, RetryAfterAdapter, RetryAfterRetry
from retry_after_adapter.header import MAX_LENGTH, format_http_date
from retry_after_adapter.policy import DEFAULT_MAX_RETRY_AFTER

from ..servers import RawServer

try:
    from tests.unit.retry_after_corpus import CORPUS, INVALID, RECEIVED_AT
except ImportError as exc:  # pragma: no cover - only while the corpus is being written
    pytest.skip(f"the Retry-After corpus is not importable ({exc})", allow_module_level=True)

FAR_FUTURE = datetime.max.replace(tzinfo=timezone.utc)
MAX_WAIT = 60.0  # the policy's default: longer delays defer
BACKOFF_FACTOR = 0.5


def header_bytes(value: str) -> bytes:
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode("utf-8")


def busy(*retry_after: bytes) -> bytes:
    """A 503 with the given Retry-After field lines (exact bytes) and Date = RECEIVED_AT."""
    lines = [b"HTTP/1.1 503 Service Unavailable"]
    lines += [b"Retry-After: " + value for value in retry_after]
    lines += [
        b"Date: " + format_http_date(RECEIVED_AT).encode("ascii"),
        b"Content-Length: 4",
        b"Connection: close",
    ]
    return b"\r\n".join(lines) + b"\r\n\r\nbusy"


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"


def session_for(clock: FakeClock, on_invalid: str = "stop", **kw: Any) -> requests.Session:
    retry = RetryAfterRetry(total=3, backoff_factor=BACKOFF_FACTOR, on_invalid=on_invalid, clock=clock, **kw)
    session = requests.Session()
    session.mount("http://", RetryAfterAdapter(retry, cooldown=MemoryCooldownStore()))
    return session


def untravelled(value: str) -> str | None:
    """Why ``value`` cannot arrive as itself in a response header, or None."""
    if "\r" in value or "\n" in value:
        return "contains CR or LF: the transport ends the header line there"
    if len(value) > MAX_LENGTH and len(value.lstrip(" \t")) <= MAX_LENGTH:
        return "too long only by its leading whitespace, which the transport trims"
    return None


def entry_id(index: int, value: str, mode: str) -> str:
    shown = value if len(value) <= 32 else f"{value[:16]}...({len(value)} chars)"
    return f"{index:03d}-{mode}-" + shown.encode("unicode_escape").decode("ascii")


CASES = []
for _index, (_value, _verdict) in enumerate(CORPUS):
    for _mode in ("stop", "backoff") if _verdict == INVALID else ("valid",):
        CASES.append(pytest.param(_value, _verdict, _mode, id=entry_id(_index, _value, _mode)))


def expected_eligible(delay: float) -> datetime:
    try:
        return RECEIVED_AT + timedelta(seconds=delay)
    except OverflowError:
        return FAR_FUTURE


def gaps(server: RawServer) -> list[float]:
    return [(b.at - a.at).total_seconds() for a, b in pairwise(server.arrivals)]


@pytest.mark.parametrize(("value", "verdict", "mode"), CASES)
def test_corpus_value_from_a_real_server(raw_server, value, verdict, mode):
    why = untravelled(value)
    if why is not None:
        pytest.skip(f"{value!r} {why}; the parser-level corpus test covers it")
    clock = FakeClock(start=RECEIVED_AT)
    raw = header_bytes(value)

    if mode == "stop":
        raw_server.script(clock, [busy(raw), OK])
        response = session_for(clock).get(raw_server.url + "/stop")
        assert response.status_code == 503 and response.text == "busy"
        assert response.stop_reason == "invalid_retry_after"
        assert response.deferral is None
        assert raw_server.count() == 1
        assert clock.sleeps == []
        return

    if mode == "backoff":
        raw_server.script(clock, [busy(raw), busy(raw), OK])
        response = session_for(clock, on_invalid="backoff").get(raw_server.url + "/backoff")
        assert response.status_code == 200 and response.stop_reason is None
        assert raw_server.count() == 3
        # urllib3's backoff: nothing after the first error, then 2 * factor.
        assert gaps(raw_server) == [0.0, 2 * BACKOFF_FACTOR]
        return

    if verdict > DEFAULT_MAX_RETRY_AFTER:
        # Valid, but longer than the default bound: rejected with its own reason...
        raw_server.script(clock, [busy(raw), OK])
        response = session_for(clock).get(raw_server.url + "/bound")
        assert response.status_code == 503 and response.stop_reason == "retry_after_too_long"
        assert response.deferral is None and raw_server.count() == 1 and clock.sleeps == []
    # ...and without a bound, obeyed: never shortened.
    raw_server.script(clock, [busy(raw), OK])
    response = session_for(clock, max_retry_after=None).get(raw_server.url + "/valid")
    eligible = expected_eligible(verdict)
    if verdict <= MAX_WAIT:
        assert response.status_code == 200 and response.deferral is None
        assert raw_server.count() == 2
        retried_at = raw_server.arrivals[1].at
        assert retried_at >= eligible  # never before RECEIVED_AT + delay, in server time
        assert retried_at - eligible < timedelta(milliseconds=1)  # and no needless extra wait
    else:
        assert response.status_code == 503 and response.text == "busy"
        deferral = response.deferral
        assert deferral.reason == "max_wait"
        assert deferral.delay == verdict
        assert deferral.eligible_at == eligible
        assert deferral.retry_after == value.strip(" \t")
        assert raw_server.count() == 1  # deferred without sending
        assert clock.sleeps == []


@pytest.mark.parametrize(
    "fields",
    [(b"1", b"2"), (b"5", b"5"), (b"120", b"Sun, 01 Mar 2026 12:02:00 GMT"), (b"0", b"")],
    ids=["different", "identical", "seconds-and-date", "one-empty"],
)
def test_repeated_retry_after_fields_are_invalid(raw_server, fields):
    clock = FakeClock(start=RECEIVED_AT)
    raw_server.script(clock, [busy(*fields), OK])
    response = session_for(clock).get(raw_server.url + "/repeated")
    assert response.stop_reason == "invalid_retry_after"
    assert raw_server.count() == 1 and clock.sleeps == []

    clock = FakeClock(start=RECEIVED_AT)
    raw_server.script(clock, [busy(*fields), busy(*fields), OK])
    response = session_for(clock, on_invalid="backoff").get(raw_server.url + "/repeated")
    assert response.status_code == 200
    assert gaps(raw_server) == [0.0, 2 * BACKOFF_FACTOR]


def test_a_nul_byte_arrives_and_is_invalid(raw_server):
    # http.server could send it too, but here it provably travels as one raw byte.
    clock = FakeClock(start=RECEIVED_AT)
    raw_server.script(clock, [busy(b"5\x00"), OK])
    response = session_for(clock).get(raw_server.url + "/nul")
    assert response.headers["Retry-After"] == "5\x00"
    assert response.stop_reason == "invalid_retry_after"
    assert raw_server.count() == 1


def test_the_corpus_is_exercised_over_the_wire():
    travelling = [value for value, _ in CORPUS if untravelled(value) is None]
    valid = [value for value, verdict in CORPUS if verdict != INVALID and untravelled(value) is None]
    assert len(travelling) >= 0.9 * len(CORPUS)
    assert any(verdict != INVALID and verdict <= MAX_WAIT for _, verdict in CORPUS)
    assert any(verdict != INVALID and verdict > MAX_WAIT for _, verdict in CORPUS)
    assert valid
