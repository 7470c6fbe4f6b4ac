"""No credential, cookie or query value ever appears in what the package produces.

Requests carry an Authorization (Bearer, or Basic made from the URL's user info), a
Cookie, a Proxy-Authorization, a query token and URL user info. Every deferral reason
and every stop is triggered against a real loopback server; then the package's log
records (DEBUG, its own logger and the root), the errors raised (str, repr, args and
their causes), the deferrals (repr and JSON), the DecisionRecords, the metrics
snapshot and the reprs of the adapter and retry objects are searched for each secret.

urllib3's own logging prints the request target *including the query string*: its
DEBUG request line ('"GET /path?query HTTP/1.1" 200'), and when it retries by itself
its warning "Retrying (...) after connection broken by ...: <url>" (1.26 and 2.x
alike). ``redact_urllib3_logs()`` masks those; the tests here install it and then
search every logger's records, urllib3's included (and check that without it urllib3
does print the query, so the search can fail).
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Iterator

import pytest
import requests
import urllib3

from retry_after_adapter import (
    CooldownStoreError,
    DeferralLimitExceeded,
    FakeClock,
    MemoryCooldownStore,
    RetryAfterAdapter,
    RetryAfterRetry,
    RetryDeferred,
    SQLiteCooldownStore,
    budget,
    public_scope,
    redact_urllib3_logs,
)
from retry_after_adapter.cooldown import Store
from retry_after_adapter.observe import Counters
from retry_after_adapter.scope import hash_scope

from ..conftest import remove_log_redaction
from ..servers import Reply, closed_port

TOKEN = "s3cr3t-token-AAA"
COOKIE = "s3cr3t-cookie-BBB"
QUERY = "s3cr3t-query-CCC"
PASSWORD = "s3cr3t-pass-DDD"
PROXY = "s3cr3t-proxy-EEE"


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


SECRETS = (
    TOKEN,
    COOKIE,
    QUERY,
    PASSWORD,
    PROXY,
    b64(f"user:{PASSWORD}"),  # the Basic header requests makes from the URL's user info
    b64(f"proxyuser:{PROXY}"),
)
SECRET_HEADERS = {
    "Cookie": f"session={COOKIE}",
    "Proxy-Authorization": f"Basic {b64(f'proxyuser:{PROXY}')}",
}


class Bearer(requests.auth.AuthBase):
    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["Authorization"] = f"Bearer {TOKEN}"
        return request


class BrokenStore(Store):
    """A cooldown store whose backend is down."""

    def get(self, scope):
        raise CooldownStoreError("backend unreachable")

    def extend(self, scope, until):
        raise CooldownStoreError("backend unreachable")


class Evidence:
    """Everything the package produced during a test, flattened to text."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.records: list[object] = []
        self.counters = Counters(by_scope=True)

    def hook(self, record) -> None:
        self.records.append(record)

    def add(self, *items: object) -> None:
        self.texts.extend(repr(item) for item in items)
        self.texts.extend(str(item) for item in items)

    def add_response(self, response: requests.Response) -> None:
        self.add(response.deferral, response.stop_reason)
        if response.deferral is not None:
            self.texts.append(json.dumps(response.deferral.to_dict()))
        retries = getattr(response.raw, "retries", None)
        if retries is not None:
            self.add(retries, retries.history)

    def add_error(self, error: BaseException) -> None:
        seen: set[int] = set()
        current: BaseException | None = error
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            self.add(current, current.args)
            deferral = getattr(current, "deferral", None)
            if deferral is not None:
                self.add(deferral, deferral.chain())
                self.texts.append(json.dumps(deferral.to_dict()))
            current = current.__cause__ or current.__context__

    def call(self, send) -> object:
        """Run ``send()`` and keep its response or error."""
        try:
            response = send()
        except requests.exceptions.RequestException as exc:
            self.add_error(exc)
            return exc
        except DeferralLimitExceeded as exc:
            self.add_error(exc)
            return exc
        self.add_response(response)
        return response


@pytest.fixture
def evidence() -> Evidence:
    return Evidence()


@pytest.fixture
def logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every logger's records at DEBUG, with the redaction filter installed."""
    caplog.set_level(logging.DEBUG)  # the root logger
    caplog.set_level(logging.DEBUG, logger="retry_after_adapter")
    redact_urllib3_logs()
    yield caplog
    remove_log_redaction()


def all_log_text(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Every record of every logger, formatted with its traceback (as a handler would)."""
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    return [formatter.format(record) for record in caplog.records]


def secret_url(port: int, path: str = "/api") -> str:
    return f"http://user:{PASSWORD}@127.0.0.1:{port}{path}?token={QUERY}&page=2"


def make(
    evidence: Evidence, clock: FakeClock, *, bearer: bool, store=None, scope=None, **kw
) -> requests.Session:
    """A session sending every kind of secret; ``bearer`` False lets requests turn the
    URL's user info into a Basic Authorization header instead."""
    store_failure = kw.pop("store_failure", "open")
    kw.setdefault("total", 2)
    retry = RetryAfterRetry(clock=clock, **kw)
    adapter = RetryAfterAdapter(
        retry,
        cooldown=store if store is not None else MemoryCooldownStore(),
        scope=scope,
        store_failure=store_failure,
        on_decision=[evidence.hook, evidence.counters],
    )
    evidence.add(adapter, retry)
    session = requests.Session()
    session.trust_env = False
    session.mount("http://", adapter)
    session.headers.update(SECRET_HEADERS)
    if bearer:
        session.auth = Bearer()
    return session


def package_log_text(caplog: pytest.LogCaptureFixture) -> list[str]:
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    texts = []
    for record in caplog.records:
        if not record.name.startswith("retry_after_adapter"):
            continue
        texts.append(formatter.format(record))
        texts.append(repr(record.args))
        texts.append(repr({k: v for k, v in vars(record).items() if k not in ("msg", "args")}))
    return texts


def assert_clean(texts: list[str]) -> None:
    blob = "\n".join(texts)
    leaked = [secret for secret in SECRETS if secret in blob]
    assert not leaked, f"secrets leaked: {leaked}"


@pytest.mark.parametrize("bearer", [True, False], ids=["bearer", "basic-from-url"])
def test_no_secret_in_anything_the_package_produces(server, clock, evidence, logs, bearer):
    store = MemoryCooldownStore()
    port = server.port

    # Deferral: max_wait (response kept), then cooldown (nothing sent).
    server.serve([Reply(429, {"Retry-After": "120"}, b"quota")])
    evidence.call(
        lambda: make(evidence, clock, bearer=bearer, store=store, max_wait=10).get(secret_url(port))
    )
    evidence.call(
        lambda: make(evidence, clock, bearer=bearer, store=store, max_wait=10).get(secret_url(port))
    )
    clock.advance(121)

    # Deferral: deadline.
    server.serve([Reply(429, {"Retry-After": "30"})])
    evidence.call(
        lambda: make(evidence, clock, bearer=bearer, deadline=12, max_wait=None).get(secret_url(port))
    )

    # Deferral: cancelled during the planned wait.
    stop = threading.Event()
    server.serve([Reply(503, {"Retry-After": "5"}), Reply(200)])
    session = make(evidence, clock, bearer=bearer)
    session.get_adapter("http://").on_decision += (lambda r: stop.set() if r.action == "retry" else None,)
    with budget(cancel=stop):
        evidence.call(lambda: session.get(secret_url(port)))

    # Deferral: cooldown-unknown (the shared store is down and the adapter fails closed).
    evidence.call(
        lambda: make(evidence, clock, bearer=bearer, store=BrokenStore(), store_failure="closed").get(
            secret_url(port)
        )
    )

    # Stop: invalid Retry-After.
    server.serve([Reply(429, {"Retry-After": "soon"})])
    evidence.call(lambda: make(evidence, clock, bearer=bearer).get(secret_url(port)))

    # Stop: exhausted, raised and returned.
    server.serve([Reply(503, {"Retry-After": "1"})])
    evidence.call(lambda: make(evidence, clock, bearer=bearer, total=1).get(secret_url(port)))
    server.serve([Reply(503, {"Retry-After": "1"})])
    evidence.call(
        lambda: make(evidence, clock, bearer=bearer, total=1, raise_on_status=False).get(secret_url(port))
    )

    # Stop: not idempotent (a POST whose connection is reset after sending).
    server.serve([Reply(action="reset")])
    evidence.call(lambda: make(evidence, clock, bearer=bearer).post(secret_url(port), data=b"x", timeout=2))

    # A GET retried after a reset (urllib3 logs its own warning about it).
    server.serve([Reply(action="reset"), Reply(200)])
    evidence.call(
        lambda: make(evidence, clock, bearer=bearer, backoff_factor=0).get(secret_url(port), timeout=2)
    )

    # Escalation: past max_deferrals.
    server.serve([Reply(429, {"Retry-After": "600"})])
    evidence.call(lambda: make(evidence, clock, bearer=bearer, max_deferrals=0).get(secret_url(port)))

    # Connection refused: urllib3's MaxRetryError names the URL it was given.
    with closed_port() as dead:
        evidence.call(
            lambda: make(evidence, clock, bearer=bearer, backoff_factor=0).get(secret_url(dead), timeout=2)
        )

    # The scenarios really ran: every deferral reason and every stop was reached.
    defers = {r.reason for r in evidence.records if r.action == "defer"}
    stops = {r.reason for r in evidence.records if r.action == "stop"}
    assert defers == {"max_wait", "cooldown", "deadline", "cancelled", "cooldown-unknown", "attempts"}
    assert stops >= {"invalid_retry_after", "not_idempotent", "max_deferrals"}
    # ... and the server did see the secrets, so there was something to leak.
    sent = repr([(s.path, s.headers) for s in server.seen])
    assert QUERY in sent and COOKIE in sent and (TOKEN in sent if bearer else b64(f"user:{PASSWORD}") in sent)

    ours = package_log_text(logs)
    assert len(ours) > 3 * 10  # DEBUG lines for retries and stops, INFO for deferrals
    assert any("defer (cooldown-unknown)" in text for text in ours)
    evidence.add(*evidence.records)
    evidence.texts.append(json.dumps(evidence.counters.snapshot()))
    assert_clean(evidence.texts + ours)
    everything = all_log_text(logs)
    assert any(r.name.startswith("urllib3") for r in logs.records)  # urllib3 did log
    assert_clean(everything)

    # urllib3 no longer retries under the engine, so its own "Retrying (...) after
    # connection broken" warning, which named the query string, is never logged.
    assert not [r for r in logs.records if "after connection broken" in r.getMessage()]


def test_credential_scope_is_hashed(server, clock, evidence):
    server.serve([Reply(429, {"Retry-After": "120"})])
    response = make(evidence, clock, bearer=True, scope="credential", max_wait=10).get(
        secret_url(server.port)
    )
    scope = response.deferral.scope
    assert scope.startswith(f"http://127.0.0.1:{server.port}|sha256:")
    assert evidence.records[-1].scope == scope
    assert_clean([scope, json.dumps(response.deferral.to_dict()), json.dumps(evidence.counters.snapshot())])


def test_two_credentials_get_two_hashed_scopes(server, clock, evidence):
    server.serve([Reply(429, {"Retry-After": "120"})])
    first = make(evidence, clock, bearer=True, scope="credential", max_wait=10).get(secret_url(server.port))
    other = make(evidence, clock, bearer=False, scope="credential", max_wait=10).get(secret_url(server.port))
    assert first.deferral.scope != other.deferral.scope
    assert_clean([first.deferral.scope, other.deferral.scope])


def test_a_scope_function_returning_the_authorization_value_is_hashed(server, clock, evidence):
    server.serve([Reply(429, {"Retry-After": "120"})])
    session = make(
        evidence, clock, bearer=True, scope=lambda request: request.headers["Authorization"], max_wait=10
    )
    response = session.get(secret_url(server.port))
    assert response.deferral.scope.startswith("sha256:")
    assert evidence.records[-1].scope == response.deferral.scope
    assert list(evidence.counters.snapshot()["scopes"]) == [response.deferral.scope]
    assert_clean([repr(response.deferral), json.dumps(evidence.counters.snapshot())])


def test_a_scope_function_returning_the_query_value_is_hashed(server, clock, evidence):
    server.serve([Reply(429, {"Retry-After": "120"})])
    session = make(
        evidence,
        clock,
        bearer=True,
        scope=lambda request: "tenant-" + request.url.split("token=")[1],
        max_wait=10,
    )
    response = session.get(secret_url(server.port))
    assert response.deferral.scope.startswith("sha256:")
    assert_clean([response.deferral.scope])


def test_plain_urllib3_errors_and_logs_hold_no_secret(server, clock, evidence, logs):
    retry = RetryAfterRetry(total=1, clock=clock, max_wait=10, on_decision=[evidence.hook, evidence.counters])
    http = urllib3.PoolManager(retries=retry, headers={"Authorization": f"Bearer {TOKEN}", **SECRET_HEADERS})
    scripts = [
        [Reply(429, {"Retry-After": "120"})],  # MaxRetryDeferred (max_wait)
        [Reply(503, {"Retry-After": "1"})],  # out of attempts: MaxRetryDeferred names the URL it got
        [Reply(429, {"Retry-After": "soon"})],  # invalid
        [Reply(action="reset")],  # transport error, retried, then exhausted
    ]
    raised = []
    for script in scripts:
        server.serve(script)
        with pytest.raises((RetryDeferred, urllib3.exceptions.MaxRetryError)) as info:
            http.request("GET", secret_url(server.port))
        raised.append(info.value)
        evidence.add_error(info.value)
        evidence.add(getattr(info.value, "url", None))
    assert [type(e).__name__ for e in raised] == [
        "MaxRetryDeferred",
        "MaxRetryDeferred",
        "MaxRetryError",
        "MaxRetryDeferred",
    ]
    assert {r.reason for r in evidence.records if r.action != "retry"} >= {
        "max_wait",
        "attempts",
        "invalid_retry_after",
    }
    evidence.add(retry, *evidence.records)
    evidence.texts.append(json.dumps(evidence.counters.snapshot()))
    assert_clean(evidence.texts + package_log_text(logs))
    assert_clean(all_log_text(logs))


def test_stock_urllib3_retrying_by_itself_logs_no_secret_with_the_filter(server, logs):
    http = urllib3.PoolManager(retries=urllib3.Retry(total=2, backoff_factor=0))
    server.serve([Reply(action="reset"), Reply(200)])
    assert http.request("GET", secret_url(server.port)).status == 200
    warned = [r for r in logs.records if "after connection broken" in r.getMessage()]
    assert warned and "token=***" in warned[0].getMessage()
    # The request line ('"GET /api?token=***&page=*** HTTP/1.1" 200'; 2.2 prints "HTTP/11").
    assert any('"GET /api?token=***&page=*** HTTP/1' in r.getMessage() for r in logs.records)
    assert_clean(all_log_text(logs))


def test_without_the_filter_urllib3_does_print_the_query(server, caplog):
    remove_log_redaction()
    caplog.set_level(logging.DEBUG)
    http = urllib3.PoolManager(retries=urllib3.Retry(total=2, backoff_factor=0))
    server.serve([Reply(action="reset"), Reply(200)])
    http.request("GET", secret_url(server.port))
    assert QUERY in "\n".join(r.getMessage() for r in caplog.records)


PARTIAL_SCOPES = {
    "bearer token": lambda r: "acct:" + r.headers["Authorization"].split()[1],
    "part of the token": lambda r: "acct-" + r.headers["Authorization"].split()[1][:10],
    "cookie value": lambda r: "c:" + r.headers["Cookie"].split("=", 1)[1],
    "decoded query value": lambda r: "q:" + r.url.split("token=")[1].split("&")[0],
    "url password": lambda r: "u:" + PASSWORD,
    "proxy credentials": lambda r: "p:" + base64.b64decode(r.headers["Proxy-Authorization"][6:]).decode(),
}


@pytest.mark.parametrize("public", [False, True], ids=["callable", "public_scope"])
@pytest.mark.parametrize("name", list(PARTIAL_SCOPES))
def test_a_scope_holding_part_of_a_credential_is_never_shown(
    server, clock, evidence, logs, tmp_path, name, public
):
    function = PARTIAL_SCOPES[name]
    store = SQLiteCooldownStore(tmp_path / "c.db")
    server.serve([Reply(429, {"Retry-After": "120"})])
    scope = public_scope(function) if public else function
    response = make(evidence, clock, bearer=True, store=store, scope=scope, max_wait=10).get(
        secret_url(server.port)
    )
    deferral = response.deferral
    assert deferral.scope.startswith("sha256:")
    assert list(store.entries()) == [deferral.scope]  # the store key is the hash too
    assert evidence.records[-1].scope == deferral.scope
    shown = [repr(deferral), json.dumps(deferral.to_dict()), json.dumps(evidence.counters.snapshot())]
    assert_clean([*shown, *store.entries(), *all_log_text(logs)])


def test_a_public_scope_without_credential_material_stays_readable(server, clock, evidence):
    server.serve([Reply(429, {"Retry-After": "120"})])
    tenant = public_scope(lambda request: "tenant-" + request.headers["X-Tenant"])
    session = make(evidence, clock, bearer=True, scope=tenant, max_wait=10)
    response = session.get(secret_url(server.port), headers={"X-Tenant": "42"})
    assert response.deferral.scope == "tenant-42"
    # The same function, not marked public, is hashed (stable across processes).
    plain = make(evidence, clock, bearer=True, scope=tenant.function, max_wait=10)
    hashed = plain.get(secret_url(server.port), headers={"X-Tenant": "42"}).deferral.scope
    assert hashed == hash_scope("tenant-42")


def test_the_httpx_transport_hands_urllib3_no_user_info_and_one_call_redacts_httpx(server, clock, caplog):
    """Through the httpx transport (0.9: urllib3's DEBUG ``Incremented Retry for
    (url='http://user:PASSWORD@...')``; httpx's own INFO line untouched by the filter):
    without any filter, what the package hands urllib3 carries no user info or query
    value; with ``redact_logs()``, httpx's and httpcore's lines carry neither either."""
    httpx = pytest.importorskip("httpx")
    from retry_after_adapter import redact_logs
    from retry_after_adapter.httpx import RetryAfterTransport

    caplog.set_level(logging.DEBUG)
    server.serve([Reply(503, {"Retry-After": "1"}), Reply(200)])
    transport = RetryAfterTransport(RetryAfterRetry(total=2, clock=clock), cooldown=MemoryCooldownStore())
    url = secret_url(server.port)
    with httpx.Client(transport=transport) as client:
        assert client.get(url).status_code == 200
    urllib3_lines = [r.getMessage() for r in caplog.records if r.name.startswith("urllib3")]
    assert any("Incremented Retry" in line for line in urllib3_lines), urllib3_lines
    assert_clean(urllib3_lines)  # no filter installed: clean as handed over
    httpx_lines = [r.getMessage() for r in caplog.records if r.name.startswith(("httpx", "httpcore"))]
    assert any(PASSWORD in line or QUERY in line for line in httpx_lines)  # httpx's own, unfiltered
    caplog.clear()
    redact_logs()
    try:
        server.serve([Reply(503, {"Retry-After": "1"}), Reply(200)])
        with httpx.Client(transport=RetryAfterTransport(RetryAfterRetry(total=2, clock=clock))) as client:
            assert client.get(url).status_code == 200
        assert any(r.name == "httpx" for r in caplog.records)
        assert_clean(all_log_text(caplog))
    finally:
        remove_log_redaction()


def test_the_requests_adapter_hands_urllib3_no_user_info(server, clock, caplog):
    caplog.set_level(logging.DEBUG)
    server.serve([Reply(503, {"Retry-After": "1"}), Reply(200)])
    session = requests.Session()
    session.trust_env = False
    session.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=2, clock=clock), cooldown=MemoryCooldownStore()))
    assert session.get(secret_url(server.port)).status_code == 200
    lines = [r.getMessage() for r in caplog.records if r.name == "urllib3.util.retry"]
    assert any("Incremented Retry" in line for line in lines), lines
    assert_clean(lines)
