"""Gemini's dialect, pure: a protobuf Duration read strictly as a wait, a Google API
error body read for its RetryInfo and QuotaFailure, a model's path read as its quota
key, and the 429 that says a quota refused the request (not processed)."""

from __future__ import annotations

import json

import pytest

from retry_after_adapter.dialects import (
    MAX_GOOGLE_BODY,
    MAX_PROTO_DURATION,
    GoogleError,
    gemini_key,
    google_rpc_error,
    google_status,
    not_processed,
    proto_duration,
    wants_google_body,
)

from .dialect_corpus import GEMINI_HEADERS, exchange, gemini_429


def getter(headers: dict[str, str]):
    lowered = {k.lower(): v for k, v in headers.items()}
    return lambda name: lowered.get(name.lower())


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [
        ("2s", 2.0),
        ("37.5s", 37.5),
        ("0s", 0.0),
        ("0.000000001s", 1e-9),
        ("1.250s", 1.25),
        ("59.999999999s", 59.999999999),
        (f"{MAX_PROTO_DURATION}s", float(MAX_PROTO_DURATION)),
    ],
)
def test_a_duration_is_read_to_the_nanosecond(raw: str, seconds: float) -> None:
    assert proto_duration(raw) == pytest.approx(seconds, abs=1e-12)


@pytest.mark.parametrize(
    "raw",
    [
        "", "s", "2", "2S", "-2s", "+2s", " 2s", "2s ", "2 s", "2.s", ".5s", "1.1234567891s", "1e3s",
        "2ms", "1m", "PT2S", "\uff12s", "2s2s", "nan s", "infs", f"{MAX_PROTO_DURATION + 1}s",
        f"{MAX_PROTO_DURATION}.5s", "9" * 70 + "s", 2, 2.0, None, True, ["2s"], {"seconds": 2},
    ],
)
def test_anything_else_is_no_duration(raw: object) -> None:
    assert proto_duration(raw) is None


def test_the_recorded_429_names_its_wait_its_quota_and_its_model() -> None:
    found = google_rpc_error(exchange("gemini-429-per-model").body)
    assert found == GoogleError(
        "RESOURCE_EXHAUSTED", "37.5s", 37.5, False, ("GenerateRequestsPerMinutePerProjectPerModel-FreeTier",),
        ("gemini-2.0-flash",), False, True,
    )
    assert found.quota_refused


def test_a_quota_without_a_model_dimension_is_the_projects() -> None:
    found = google_rpc_error(exchange("gemini-429-project").body)
    assert found is not None and found.project_wide and found.models == () and found.delay == 2.0
    per_model_id = google_rpc_error(gemini_429(model=None, quota_id="GenerateContentInputTokensPerModelPerMinute"))
    assert per_model_id is not None and not per_model_id.project_wide  # "PerModel" in its id


@pytest.mark.parametrize("delay", ["37.5", "-1s", "1e3s", "", "2 s", 37.5, None, "PT37S"])
def test_a_malformed_retry_delay_is_invalid_not_absent(delay: object) -> None:
    body = json.loads(gemini_429())
    body["error"]["details"][2]["retryDelay"] = delay
    found = google_rpc_error(json.dumps(body).encode())
    assert found is not None and found.invalid and found.delay is None
    assert found.retry_delay is not None  # shown as sent when printable, else "?"


def test_a_retry_info_without_a_delay_or_sent_twice_is_invalid() -> None:
    body = json.loads(gemini_429("5s"))
    del body["error"]["details"][2]["retryDelay"]
    found = google_rpc_error(json.dumps(body).encode())
    assert found is not None and found.invalid and found.retry_delay == "?"
    body = json.loads(gemini_429("5s"))
    body["error"]["details"].append({"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "1s"})
    twice = google_rpc_error(json.dumps(body).encode())
    assert twice is not None and twice.invalid and twice.delay is None  # never the shorter of two


@pytest.mark.parametrize(
    "body",
    [
        b"", b"not json", b"[]", b"{}", b'{"error": "rate limited"}', b'{"error": []}', b"[1, 2]",
        b'{"message": "x"}', b"[" * 100_000, b"{" + b" " * MAX_GOOGLE_BODY + b"}",
    ],
)
def test_what_is_not_a_google_error_says_nothing(body: bytes) -> None:
    assert google_rpc_error(body) is None


def test_a_streamed_error_a_list_of_one_is_read() -> None:
    found = google_rpc_error(b"[" + gemini_429("3s") + b"]")
    assert found is not None and found.delay == 3.0


def test_no_retry_info_is_no_wait_and_not_invalid() -> None:
    body = json.loads(gemini_429())
    del body["error"]["details"][2]
    found = google_rpc_error(json.dumps(body).encode())
    assert found is not None and found.retry_delay is None and not found.invalid and found.quota_refused


def test_hostile_quota_ids_and_models_are_dropped() -> None:
    body = json.loads(gemini_429(model="gemini\r\nx-injected: 1", quota_id="a b?key=AIzaSecret"))
    found = google_rpc_error(json.dumps(body).encode())
    assert found is not None and found.quota_ids == () and found.models == ()


@pytest.mark.parametrize(
    ("path", "key"),
    [
        ("/v1beta/models/gemini-2.0-flash:generateContent", "gemini:gemini-2.0-flash"),
        ("/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse&key=AIzaT0k3n", "gemini:gemini-2.0-flash"),
        ("https://user:pw@generativelanguage.googleapis.com/v1/models/text-embedding-004:embedContent",
         "gemini:text-embedding-004"),
        ("/v1beta/tunedModels/my-model-7:generateContent", "gemini:tunedModels/my-model-7"),
        ("/v1/projects/p-1/locations/us-central1/publishers/google/models/gemini-2.0-flash-001:predict",
         "gemini:p-1/us-central1/gemini-2.0-flash-001"),
        ("/v1beta/models/gemini-2.0-flash", None),  # a model's metadata: no custom method
        ("/v1beta/models", None),
        ("/api/models/x:y/z", None),
        ("/v1beta/files/abc:download", None),
        ("/v1/chat/completions", None),
    ],
)
def test_a_models_path_is_its_quota_key(path: str, key: str | None) -> None:
    assert gemini_key(path) == key


def test_a_key_never_holds_the_query() -> None:
    key = gemini_key("/v1beta/models/m:generateContent?key=AIzaT0k3n-gemini")
    assert key is not None and "AIza" not in key and "?" not in key


def test_only_a_429_with_a_json_body_and_no_wait_in_its_fields_is_read() -> None:
    assert wants_google_body(429, getter(GEMINI_HEADERS))
    assert not wants_google_body(200, getter(GEMINI_HEADERS))  # a 200 is never read
    assert not wants_google_body(503, getter(GEMINI_HEADERS))
    assert not wants_google_body(429, getter({**GEMINI_HEADERS, "Retry-After": "3"}))
    assert not wants_google_body(429, getter({**GEMINI_HEADERS, "retry-after-ms": "300"}))
    assert not wants_google_body(429, getter({"Content-Type": "text/html"}))
    assert not wants_google_body(429, getter({}))


def test_a_quota_refusal_is_not_processed_and_nothing_else_is() -> None:
    get = getter(GEMINI_HEADERS)
    assert not_processed(429, get, gemini_429())
    assert not not_processed(429, get, None)  # the body not read: nothing known
    assert not not_processed(503, get, gemini_429())
    other = json.loads(gemini_429())
    other["error"]["status"] = "UNAVAILABLE"
    assert not not_processed(429, get, json.dumps(other).encode())
    assert not not_processed(429, get, b'{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED"}}')


def test_a_local_status_names_a_wait_never_shorter() -> None:
    status = google_status(1.2001, "deferred")
    assert status["status"] == "RESOURCE_EXHAUSTED" and status["code"] == 429
    delay = status["details"][0]["retryDelay"]
    assert delay == "1.201s" and proto_duration(delay) >= 1.2001
    assert google_status(37.0, "x")["details"][0]["retryDelay"] == "37.000s"
    found = google_rpc_error(json.dumps({"error": google_status(2.5, "x")}).encode())
    assert found is not None and found.delay == 2.5 and found.quota_refused
