"""Recorded exchanges of the APIs people call: the request, and the response headers
(and body, where it tells answers apart) as each provider documents them.

Times: every response is received at RECEIVED_AT and carries ``Date: DATE`` (equal to
it); the providers' epoch values are rewritten relative to EPOCH so that the expected
waits are exact. Shared by the parser tests (``test_dialects.py``) and the loopback
replay tests (``tests/integration/test_dialects.py``), where a real server sends them.

``expected`` is what :func:`~retry_after_adapter.quota.read_quota` reads:
``(remaining, reset seconds, limit, window seconds)``, or None (nothing usable).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone

from .quota_corpus import DATE, EPOCH, RECEIVED_AT

__all__ = ["DATE", "EPOCH", "EXCHANGES", "RECEIVED_AT", "Exchange", "exchange"]

Expected = tuple[int, float | None, int | None, float | None] | None


@dataclass(frozen=True)
class Exchange:
    """One recorded request and answer."""

    name: str
    method: str
    path: str
    request: dict[str, str]
    status: int
    headers: dict[str, str]
    expected: Expected
    body: bytes = b""
    #: Where the provider documents it.
    source: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)


GITHUB_DOCS = "https://docs.github.com/en/rest/using-the-rest-api/rate-limits-for-the-rest-api"
GITHUB_BEST = "https://docs.github.com/en/rest/using-the-rest-api/best-practices-for-using-the-rest-api"
GITHUB_REQUEST = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"}
DISCORD_DOCS = "https://discord.com/developers/docs/topics/rate-limits"
CLOUDFLARE_DOCS = "https://developers.cloudflare.com/fundamentals/api/reference/limits/"
SHOPIFY_DOCS = "https://shopify.dev/docs/api/usage/limits"
ENVOY_DOCS = "https://www.envoyproxy.io/docs/envoy/latest/api-v3/extensions/filters/http/ratelimit/v3/rate_limit.proto"
IETF_07 = "https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-ratelimit-headers-07"
IETF_11 = "https://datatracker.ietf.org/doc/html/draft-ietf-httpapi-ratelimit-headers-11"
OPENAI_DOCS = "https://platform.openai.com/docs/guides/rate-limits"
AZURE_DOCS = "https://learn.microsoft.com/en-us/azure/ai-foundry/openai/quotas-limits"
ANTHROPIC_DOCS = "https://docs.anthropic.com/en/api/rate-limits"
OPENAI_REQUEST = {"Authorization": "Bearer sk-t0k3n-openai", "Content-Type": "application/json"}
AZURE_REQUEST = {"api-key": "t0k3n-azure", "Content-Type": "application/json"}
ANTHROPIC_REQUEST = {"x-api-key": "sk-ant-t0k3n", "anthropic-version": "2023-06-01", "content-type": "application/json"}
CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
GEMINI_DOCS = "https://ai.google.dev/gemini-api/docs/rate-limits"
GEMINI_ERRORS = "https://cloud.google.com/apis/design/errors#error_details"
#: The GenAI SDK's request (its API key in a field; ``?key=`` is the REST alternative).
GEMINI_REQUEST = {
    "x-goog-api-key": "AIzaT0k3n-gemini",
    "x-goog-api-client": "google-genai-sdk/3.6.1 gl-python/3.11.7",
    "Content-Type": "application/json",
}
GEMINI_GENERATE = "/v1beta/models/gemini-2.0-flash:generateContent"
#: What Google's front end sends with a Gemini error (no Retry-After, no quota field).
GEMINI_HEADERS = {
    "Content-Type": "application/json; charset=UTF-8",
    "Vary": "Origin, X-Origin, Referer",
    "Server": "scaffolding on HTTPServer2",
    "X-XSS-Protection": "0",
    "X-Frame-Options": "SAMEORIGIN",
    "X-Content-Type-Options": "nosniff",
    "Server-Timing": "gfet4t7; dur=218",
}


def gemini_429(retry_delay: str = "37.5s", model: str | None = "gemini-2.0-flash",
               quota_id: str = "GenerateRequestsPerMinutePerProjectPerModel-FreeTier") -> bytes:
    """Gemini's 429 body as the API sends it (a ``google.rpc.Status``): the quota
    violated (its id, model and location), a Help link, and the wait (``RetryInfo``)."""
    dimensions = {"location": "global", **({"model": model} if model is not None else {})}
    return (
        b'{\n  "error": {\n    "code": 429,\n    "message": "You exceeded your current quota, please check '
        b'your plan and billing details. For more information on this error, head to: '
        b'https://ai.google.dev/gemini-api/docs/rate-limits.",\n    "status": "RESOURCE_EXHAUSTED",\n'
        b'    "details": [\n      {\n        "@type": "type.googleapis.com/google.rpc.QuotaFailure",\n'
        b'        "violations": [\n          {\n            "quotaMetric": '
        b'"generativelanguage.googleapis.com/generate_content_free_tier_requests",\n'
        b'            "quotaId": "' + quota_id.encode() + b'",\n            "quotaDimensions": '
        + json.dumps(dimensions).encode() + b',\n            "quotaValue": "15"\n          }\n        ]\n'
        b'      },\n      {\n        "@type": "type.googleapis.com/google.rpc.Help",\n        "links": [\n'
        b'          {\n            "description": "Learn more about Gemini API quotas",\n'
        b'            "url": "https://ai.google.dev/gemini-api/docs/rate-limits"\n          }\n        ]\n'
        b'      },\n      {\n        "@type": "type.googleapis.com/google.rpc.RetryInfo",\n'
        b'        "retryDelay": "' + retry_delay.encode() + b'"\n      }\n    ]\n  }\n}\n'
    )
AZURE_CHAT = "/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21"

SECONDARY_BODY = (
    b'{"message": "You have exceeded a secondary rate limit. Please wait a few minutes before you '
    b'try again. If you reach out to GitHub Support for help, please include the request ID '
    b'DDE6:3F5B:1A2B3C:4D5E6F:65A1B2C3.", "documentation_url": '
    b'"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits", '
    b'"status": "403"}'
)
FORBIDDEN_BODY = (
    b'{"message": "Resource not accessible by integration", "documentation_url": '
    b'"https://docs.github.com/rest/repos/repos#update-a-repository", "status": "403"}'
)


def _openai(requests: tuple[int, int, str], tokens: tuple[int, int, str], **more: str) -> dict[str, str]:
    """OpenAI's headers: (limit, remaining, reset) of requests and of tokens."""
    return {
        "x-ratelimit-limit-requests": str(requests[0]),
        "x-ratelimit-remaining-requests": str(requests[1]),
        "x-ratelimit-reset-requests": requests[2],
        "x-ratelimit-limit-tokens": str(tokens[0]),
        "x-ratelimit-remaining-tokens": str(tokens[1]),
        "x-ratelimit-reset-tokens": tokens[2],
        "x-request-id": "req_0a1b2c3d4e5f",
        "openai-processing-ms": "312",
        "Content-Type": "application/json",
        **more,
    }


def _at(seconds: float) -> str:
    """EPOCH + ``seconds`` as RFC 3339 (UTC), as Anthropic names its resets."""
    return datetime.fromtimestamp(EPOCH + seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _anthropic(**kinds: tuple[int, int, float]) -> dict[str, str]:
    """Anthropic's headers: (limit, remaining, reset seconds after EPOCH) per kind
    (``input_tokens`` for input-tokens, and so on)."""
    headers = {"request-id": "req_018EeWyXxfu5pfWkrYcMdjWG", "Content-Type": "application/json"}
    for kind, (limit, remaining, reset) in kinds.items():
        field = "anthropic-ratelimit-" + kind.replace("_", "-")
        headers |= {f"{field}-limit": str(limit), f"{field}-remaining": str(remaining), f"{field}-reset": _at(reset)}
    return headers


def _github(remaining: int, reset: int, **more: str) -> dict[str, str]:
    return {
        "x-ratelimit-limit": "5000",
        "x-ratelimit-remaining": str(remaining),
        "x-ratelimit-used": str(5000 - remaining),
        "x-ratelimit-reset": str(reset),
        "x-ratelimit-resource": "core",
        "x-github-request-id": "DDE6:3F5B:1A2B3C:4D5E6F:65A1B2C3",
        **more,
    }


EXCHANGES: list[Exchange] = [
    # -- GitHub: the primary limit, on a 200 and on its 403 -------------------------------
    Exchange(
        "github-primary-200-left", "GET", "/repos/octocat/hello-world", GITHUB_REQUEST, 200,
        _github(4999, EPOCH + 1800), (4999, 1800.0, 5000, None), source=GITHUB_DOCS,
    ),
    Exchange(
        "github-primary-200-exhausted", "GET", "/repos/octocat/hello-world", GITHUB_REQUEST, 200,
        _github(0, EPOCH + 1800), (0, 1800.0, 5000, None), source=GITHUB_DOCS,
    ),
    Exchange(
        "github-primary-403", "GET", "/repos/octocat/hello-world", GITHUB_REQUEST, 403,
        _github(0, EPOCH + 1800), (0, 1800.0, 5000, None),
        b'{"message": "API rate limit exceeded for user ID 1.", "status": "403"}', GITHUB_DOCS,
    ),
    # -- GitHub: secondary limits ---------------------------------------------------------
    Exchange(
        "github-secondary-retry-after", "POST", "/repos/octocat/hello-world/issues", GITHUB_REQUEST, 403,
        _github(4990, EPOCH + 1800, **{"retry-after": "60"}), (4990, 1800.0, 5000, None),
        SECONDARY_BODY, GITHUB_DOCS,
    ),
    Exchange(
        "github-secondary-reset", "GET", "/search/code", GITHUB_REQUEST, 429,
        {**_github(0, EPOCH + 45), "x-ratelimit-resource": "code_search"}, (0, 45.0, 5000, None),
        SECONDARY_BODY, GITHUB_DOCS,
    ),
    Exchange(
        "github-secondary-no-wait-403", "POST", "/repos/octocat/hello-world/issues", GITHUB_REQUEST, 403,
        _github(4990, EPOCH + 1800), (4990, 1800.0, 5000, None), SECONDARY_BODY, GITHUB_DOCS,
    ),
    Exchange(
        "github-secondary-no-wait-429", "GET", "/repos/octocat/hello-world/events", GITHUB_REQUEST, 429,
        _github(4990, EPOCH + 1800), (4990, 1800.0, 5000, None), SECONDARY_BODY, GITHUB_DOCS,
    ),
    Exchange(
        "github-permission-denied-403", "PATCH", "/repos/octocat/hello-world", GITHUB_REQUEST, 403,
        _github(4990, EPOCH + 1800), (4990, 1800.0, 5000, None), FORBIDDEN_BODY, GITHUB_BEST,
    ),
    # -- Discord ----------------------------------------------------------------------------
    Exchange(
        "discord-200", "GET", "/api/v10/channels/1001/messages", {"Authorization": "Bot t0k3n-discord"}, 200,
        {
            "X-RateLimit-Limit": "5",
            "X-RateLimit-Remaining": "1",
            "X-RateLimit-Reset": f"{EPOCH + 1}.500",
            "X-RateLimit-Reset-After": "1.5",
            "X-RateLimit-Bucket": "abcd1234",
        },
        (1, 1.5 + 0.1, 5, None), source=DISCORD_DOCS,  # each decimal at its latest: one unit more
    ),
    Exchange(
        "discord-200-exhausted", "GET", "/api/v10/channels/1001/messages", {"Authorization": "Bot t0k3n-discord"},
        200,
        {
            "X-RateLimit-Limit": "5",
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset": f"{EPOCH + 2}.250",
            "X-RateLimit-Reset-After": "2.25",
            "X-RateLimit-Bucket": "abcd1234",
        },
        (0, 2.25 + 0.01, 5, None), source=DISCORD_DOCS,
    ),
    Exchange(
        "discord-reset-epoch-decimals", "GET", "/api/v10/channels/1001/messages", {}, 200,
        {"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": f"{EPOCH + 3}.125"},
        (0, float(f"{EPOCH + 3}.125") + 0.001 - EPOCH, 5, None), source=DISCORD_DOCS,
    ),
    Exchange(
        "discord-429-user", "POST", "/api/v10/channels/1001/messages", {"Authorization": "Bot t0k3n-discord"}, 429,
        {
            "Retry-After": "65",
            "X-RateLimit-Limit": "10",
            "X-RateLimit-Remaining": "0",
            "X-RateLimit-Reset": f"{EPOCH + 64}.570",
            "X-RateLimit-Reset-After": "64.57",
            "X-RateLimit-Bucket": "abcd1234",
            "X-RateLimit-Scope": "user",
            "Content-Type": "application/json",
        },
        (0, 64.57 + 0.01, 10, None),
        b'{"message": "You are being rate limited.", "retry_after": 64.57, "global": false}', DISCORD_DOCS,
    ),
    Exchange(
        "discord-429-global", "POST", "/api/v10/channels/1001/messages", {"Authorization": "Bot t0k3n-discord"}, 429,
        {
            "Retry-After": "65",
            "X-RateLimit-Global": "true",
            "X-RateLimit-Scope": "global",
            "Content-Type": "application/json",
        },
        None,
        b'{"message": "You are being rate limited.", "retry_after": 64.57, "global": true}', DISCORD_DOCS,
    ),
    # -- Cloudflare's API (IETF draft 08's List, field names in its own case) ----------------
    Exchange(
        "cloudflare-left", "GET", "/client/v4/zones", {"Authorization": "Bearer cf-t0ken"}, 200,
        {"Ratelimit": '"default";r=50;t=30', "Ratelimit-Policy": '"burst";q=100;w=60'},
        (50, 30.0, 100, 60.0), source=CLOUDFLARE_DOCS,
    ),
    Exchange(
        "cloudflare-exhausted", "GET", "/client/v4/zones", {"Authorization": "Bearer cf-t0ken"}, 200,
        {"ratelimit": '"default";r=0;t=30', "ratelimit-policy": '"burst";q=100;w=60'},
        (0, 30.0, 100, 60.0), source=CLOUDFLARE_DOCS,
    ),
    # -- Shopify: Retry-After with decimals ----------------------------------------------------
    Exchange(
        "shopify-429", "GET", "/admin/api/2024-01/products.json", {"X-Shopify-Access-Token": "shpat_t0k3n"}, 429,
        {"Retry-After": "2.0", "X-Shopify-Shop-Api-Call-Limit": "40/40"}, None,
        b'{"errors": "Exceeded 2 calls per second for api client. Reduce request rates to resume '
        b'uninterrupted service."}', SHOPIFY_DOCS,
    ),
    # -- Envoy's older x-ratelimit-* -------------------------------------------------------
    Exchange(
        "envoy-exhausted", "GET", "/service", {}, 429,
        {"x-ratelimit-limit": '10, 10;w=1;name="per-ip"', "x-ratelimit-remaining": "0", "x-ratelimit-reset": "1"},
        (0, 1.0, 10, 1.0), source=ENVOY_DOCS,
    ),
    Exchange(
        "envoy-left", "GET", "/service", {}, 200,
        {"x-ratelimit-limit": '10, 10;w=1;name="per-ip"', "x-ratelimit-remaining": "7", "x-ratelimit-reset": "1"},
        (7, 1.0, 10, 1.0), source=ENVOY_DOCS,
    ),
    Exchange(
        "envoy-two-policies", "GET", "/service", {}, 200,
        {
            "x-ratelimit-limit": '10, 1000;w=3600, 10;w=1;name="per-ip"',
            "x-ratelimit-remaining": "0",
            "x-ratelimit-reset": "1",
        },
        (0, 1.0, 10, 1.0), source=ENVOY_DOCS,
    ),
    # -- IETF drafts -------------------------------------------------------------------------
    Exchange(
        "ietf-07-dictionary", "GET", "/items", {}, 200,
        {"RateLimit": "limit=100, remaining=0, reset=30", "RateLimit-Policy": "100;w=60"},
        (0, 30.0, 100, 60.0), source=IETF_07,
    ),
    Exchange(
        "ietf-11-list", "GET", "/items", {}, 200,
        {"RateLimit": '"default";r=0;t=30', "RateLimit-Policy": '"default";q=100;w=60'},
        (0, 30.0, 100, 60.0), source=IETF_11,
    ),
    Exchange(
        "ietf-rename-a-w", "GET", "/items", {}, 200,
        {"RateLimit": '"default";a=0;w=30;c=1', "RateLimit-Policy": '"default";q=100;w=60',
         "RateLimit-Partition": ":cGFydGl0aW9u:"},
        (0, 30.0, 100, 60.0), source="https://github.com/ietf-wg-httpapi/ratelimit-headers/issues",
    ),
    Exchange(
        "ietf-mixed-generations-r-wins", "GET", "/items", {}, 200,
        {"RateLimit": '"default";r=5;t=10;a=0;w=3600'}, (5, 10.0, None, None), source=IETF_11,
    ),
    # -- OpenAI, Azure OpenAI ------------------------------------------------------------------
    Exchange(
        "openai-429-requests", "POST", CHAT, OPENAI_REQUEST, 429,
        _openai((60, 0, "1s"), (150000, 149000, "400ms"), **{"retry-after": "2", "retry-after-ms": "1200",
                                                              "x-should-retry": "true"}),
        (0, 0.034 + 0.05, 60, None),  # a bucket: the next unit in (1 + 1) s / 60, rounded up, + margin
        b'{"error": {"message": "Rate limit reached for gpt-4o on requests per min (RPM): Limit 60, Used 60, '
        b'Requested 1. Please try again in 1.2s.", "type": "requests", "code": "rate_limit_exceeded"}}',
        OPENAI_DOCS,
    ),
    Exchange(
        "openai-200-exhausted", "POST", CHAT, OPENAI_REQUEST, 200,
        _openai((200, 0, "6m0s"), (40000, 39000, "1.5s")), (0, 1.805 + 0.05, 200, None),
        b'{"id": "chatcmpl-1", "object": "chat.completion"}', OPENAI_DOCS,
    ),
    Exchange(
        "openai-200-left", "POST", CHAT, OPENAI_REQUEST, 200,
        _openai((500, 499, "120ms"), (30000, 29500, "1s")), (499, 0.121 + 0.05, 500, None),
        b'{"id": "chatcmpl-2", "object": "chat.completion"}', OPENAI_DOCS,
    ),
    Exchange(
        "openai-200-tokens-spent", "POST", CHAT, OPENAI_REQUEST, 200,
        _openai((500, 499, "120ms"), (30000, 0, "1m30s")), (0, 91 / 500 + 0.05, None, None),
        b'{"id": "chatcmpl-3", "object": "chat.completion"}', OPENAI_DOCS,
    ),
    Exchange(
        "openai-500-should-not-retry", "POST", CHAT, OPENAI_REQUEST, 500,
        {"x-should-retry": "false", "x-request-id": "req_0a1b2c3d4e5f", "Content-Type": "application/json"}, None,
        b'{"error": {"message": "The server had an error processing your request.", "type": "server_error"}}',
        OPENAI_DOCS,
    ),
    Exchange(
        "azure-429-ms", "POST", AZURE_CHAT, AZURE_REQUEST, 429,
        {
            "x-ms-retry-after-ms": "1500",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-remaining-tokens": "0",
            "apim-request-id": "8f2c1a5e-0000-4000-8000-000000000000",
            "Content-Type": "application/json",
        },
        (0, None, None, None),
        b'{"error": {"code": "429", "message": "Requests to the ChatCompletions_Create Operation under Azure '
        b'OpenAI API version 2024-10-21 have exceeded token rate limit of your current AIServices S0 pricing '
        b'tier. Please retry after 2 seconds."}}',
        AZURE_DOCS,
    ),
    # -- Anthropic -------------------------------------------------------------------------------
    Exchange(
        "anthropic-200-exhausted", "POST", MESSAGES, ANTHROPIC_REQUEST, 200,
        _anthropic(requests=(50, 0, 30), tokens=(80000, 79000, 2), input_tokens=(40000, 39500, 2),
                   output_tokens=(8000, 7500, 3)),
        (0, 0.62 + 0.05, 50, None), b'{"id": "msg_01", "type": "message"}', ANTHROPIC_DOCS,
    ),
    Exchange(
        "anthropic-200-output-tokens-spent", "POST", MESSAGES, ANTHROPIC_REQUEST, 200,
        _anthropic(requests=(50, 49, 1), tokens=(80000, 72000, 12), output_tokens=(8000, 0, 12)),
        (0, 13 / 50 + 0.05, None, None), b'{"id": "msg_02", "type": "message"}', ANTHROPIC_DOCS,
    ),
    Exchange(
        "anthropic-429", "POST", MESSAGES, ANTHROPIC_REQUEST, 429,
        {"retry-after": "5", **_anthropic(requests=(50, 0, 5), tokens=(80000, 80000, 1))}, (0, 0.12 + 0.05, 50, None),
        b'{"type": "error", "error": {"type": "rate_limit_error", "message": "Number of request tokens has '
        b'exceeded your per-minute rate limit"}}',
        ANTHROPIC_DOCS,
    ),
    # -- Gemini: the wait and the quota in the JSON body, nothing in the fields -----------------
    Exchange(
        "gemini-429-per-model", "POST", GEMINI_GENERATE, GEMINI_REQUEST, 429, GEMINI_HEADERS, None,
        gemini_429("37.5s"), GEMINI_DOCS, ("the wait is RetryInfo's retryDelay, a protobuf Duration",),
    ),
    Exchange(
        "gemini-429-project", "POST", GEMINI_GENERATE, GEMINI_REQUEST, 429, GEMINI_HEADERS, None,
        gemini_429("2s", model=None, quota_id="GenerateRequestsPerDayPerProject"), GEMINI_ERRORS,
        ("a quota of the whole project: no model dimension",),
    ),
    Exchange(
        "gemini-200", "POST", GEMINI_GENERATE, GEMINI_REQUEST, 200, {"Content-Type": "application/json; charset=UTF-8"},
        None, b'{"candidates": [{"content": {"parts": [{"text": "hi"}], "role": "model"}, "finishReason": "STOP"}]}',
        GEMINI_DOCS,
    ),
    # -- X-RateLimit-Reset in epoch milliseconds ---------------------------------------------
    Exchange(
        "x-reset-epoch-ms", "GET", "/items", {}, 200,
        {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": str((EPOCH + 30) * 1000)},
        (0, 30.0, None, None),
    ),
    Exchange(
        "x-reset-epoch-ms-decimals", "GET", "/items", {}, 200,
        {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": f"{(EPOCH + 30) * 1000 + 500}.0"},
        (0, (float(f"{(EPOCH + 30) * 1000 + 500}.0") + 0.1) / 1000 - EPOCH, None, None),
    ),
]  # fmt: skip


def exchange(name: str) -> Exchange:
    """The recorded exchange named ``name``."""
    for found in EXCHANGES:
        if found.name == name:
            return found
    raise KeyError(name)


# (name, headers, expected (remaining, reset)) cases of the pure reading alone, in the
# style of quota_corpus.CORPUS: the edges of each dialect.
R = "RateLimit"
XR = "X-RateLimit-Remaining"
XT = "X-RateLimit-Reset"
XL = "X-RateLimit-Limit"

EDGES: list[tuple[str, dict[str, str], Expected]] = [
    # epoch seconds / milliseconds / seconds from now, against the Date
    ("reset-delta-largest", {XR: "0", XT: "999999999", "Date": DATE}, (0, 999999999.0, None, None)),
    ("reset-epoch-seconds", {XR: "0", XT: str(EPOCH + 30), "Date": DATE}, (0, 30.0, None, None)),
    ("reset-epoch-ms", {XR: "0", XT: str((EPOCH + 30) * 1000), "Date": DATE}, (0, 30.0, None, None)),
    ("reset-epoch-ms-past", {XR: "0", XT: str((EPOCH - 30) * 1000), "Date": DATE}, (0, 0.0, None, None)),
    (
        "reset-epoch-ms-against-the-date",
        {XR: "0", XT: str((EPOCH + 130) * 1000), "Date": "Sun, 01 Mar 2026 12:01:40 GMT"},
        (0, 30.0, None, None),
    ),
    ("reset-epoch-ms-no-date", {XR: "0", XT: str((EPOCH + 30) * 1000)}, (0, 30.0, None, None)),
    # Envoy's limit list
    ("envoy-plain-limit", {XR: "3", XL: "10"}, (3, None, 10, None)),
    ("envoy-window-of-the-limit", {XR: "3", XL: '10, 100;w=60, 10;w=1'}, (3, None, 10, 1.0)),
    ("envoy-window-of-another", {XR: "3", XL: "10, 100;w=60"}, (3, None, 10, 60.0)),
    ("envoy-bad-limit-ignored", {XR: "3", XL: '"ten", 10;w=1'}, (3, None, None, None)),
    ("envoy-negative-window-ignored", {XR: "3", XL: "10, 10;w=-1"}, (3, None, 10, None)),
    ("envoy-garbage-limit-ignored", {XR: "3", XL: "10,, 10;w=1"}, (3, None, None, None)),
    ("envoy-remaining-list-ignored", {XR: "0, 0", XL: "10, 10;w=1"}, None),
    # the IETF rename, guarded
    ("rename-a-w", {R: '"d";a=0;w=30'}, (0, 30.0, None, None)),
    ("rename-a-without-w", {R: '"d";a=0'}, (0, None, None, None)),
    ("rename-bad-a-says-nothing", {R: '"d";a=-1;w=30'}, None),
    ("rename-a-decimal-says-nothing", {R: '"d";a=0.5;w=30'}, None),
    ("rename-cost-ignored", {R: '"d";a=3;w=30;c=5'}, (3, 30.0, None, None)),
    ("r-wins-over-a", {R: '"d";r=5;t=10;a=0;w=3600'}, (5, 10.0, None, None)),
    ("bad-r-never-falls-back-to-a", {R: '"d";r=-1;a=0;w=30'}, None),
    ("t-beside-a-is-not-read", {R: '"d";a=0;t=30'}, (0, None, None, None)),
    ("w-beside-r-is-not-read", {R: '"d";r=0;w=30'}, (0, None, None, None)),
    ("unknown-parameters-ignored", {R: '"d";r=2;t=5;zz=?1;c=9'}, (2, 5.0, None, None)),
    ("one-generation-per-item", {R: '"a";r=4;t=10, "b";a=1;w=20'}, (1, 20.0, None, None)),
    ("unreadable-field-ignored", {R: '"d";a=0;w=30;'}, None),
]
