"""Properties of Gemini's dialect over generated values (bounded, fast): a protobuf
Duration is read exactly and anything else is None (never 0, never an exception); any
bytes given as a body are read without raising; a wait never comes from a RetryInfo
that is not one valid Duration."""

from __future__ import annotations

import json
from fractions import Fraction

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retry_after_adapter.dialects import MAX_PROTO_DURATION, google_rpc_error, proto_duration

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(st.integers(0, MAX_PROTO_DURATION - 1), st.one_of(st.none(), st.text("0123456789", min_size=1, max_size=9)))
def test_every_duration_is_read_exactly(seconds: int, fraction: str | None) -> None:
    text = f"{seconds}s" if fraction is None else f"{seconds}.{fraction}s"
    exact = Fraction(seconds) + (Fraction(int(fraction), 10 ** len(fraction)) if fraction else 0)
    read = proto_duration(text)
    assert read is not None and abs(Fraction(read) - exact) <= exact * Fraction(1, 2**50) + Fraction(1, 10**12)


@SETTINGS
@given(st.text(max_size=40))
def test_anything_else_is_none_or_a_duration_it_spells(text: str) -> None:
    read = proto_duration(text)
    if read is None:
        return
    assert text.endswith("s") and text[:-1].replace(".", "", 1).isascii() and read >= 0


@SETTINGS
@given(st.binary(max_size=300))
def test_any_body_is_read_without_raising(body: bytes) -> None:
    google_rpc_error(body)


@SETTINGS
@given(st.lists(st.one_of(st.text(max_size=12), st.integers(), st.none(), st.floats()), min_size=0, max_size=3))
def test_a_wait_comes_only_from_one_valid_retry_info(delays: list[object]) -> None:
    details = [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": d} for d in delays]
    body = json.dumps({"error": {"code": 429, "status": "RESOURCE_EXHAUSTED", "details": details}}).encode()
    found = google_rpc_error(body)
    assert found is not None
    if len(delays) == 1 and proto_duration(delays[0]) is not None:
        assert found.delay == proto_duration(delays[0]) and not found.invalid
    else:
        assert found.delay is None and found.invalid == bool(delays)
