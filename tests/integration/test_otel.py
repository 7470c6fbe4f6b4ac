"""The OpenTelemetry hook on every front end, read back through the SDK's in-memory
metric reader and span exporter: the metrics are there with bounded attributes, the
current span gets its events and ``http.request.resend_count``, and no credential,
query or path reaches any exported attribute, event or log record at DEBUG.

Real loopback servers, the real requests adapter, urllib3 pool manager, httpx and
httpx2 transports (sync and async) and aiohttp middleware; the FakeClock makes every
wait instant.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk")

import httpx
import requests
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from retry_after_adapter import (
    FakeClock,
    MemoryCooldownStore,
    Quota,
    RetryAfterAdapter,
    RetryAfterPoolManager,
    RetryAfterRetry,
    public_scope,
    redact_logs,
)
from retry_after_adapter.httpx import AsyncRetryAfterTransport, RetryAfterTransport
from retry_after_adapter.observe import DecisionRecord
from retry_after_adapter.otel import ADMISSION_OUTCOMES, WAIT_REASONS, OTelHook, instrument, origin_attributes
from retry_after_adapter.policy import DEFER_REASONS
from retry_after_adapter.testing.ports import closed_port

from ..conftest import remove_log_redaction
from ..servers import Reply, ThrottleServer

FRONTS = ("requests", "urllib3", "httpx", "httpx-async", "httpx2", "httpx2-async", "aiohttp")

#: Every attribute key a metric point may carry, and the values of the fixed sets.
METRIC_KEYS = {"retry_after.reason", "retry_after.outcome", "retry_after.cause", "server.address", "server.port"}
REASONS = {*map(str, DEFER_REASONS), *WAIT_REASONS, "other"}

TOKEN = "s3cr3t-token-AAA"
QUERY = "s3cr3t-query-CCC"
PASSWORD = "s3cr3t-pass-DDD"
PATH = "private-path-EEE"
BASIC = base64.b64encode(f"user:{PASSWORD}".encode()).decode()
SECRETS = (TOKEN, QUERY, PASSWORD, BASIC)


class OTel:
    """An SDK meter provider and tracer provider on in-memory exports, and the hook."""

    def __init__(self, **kw: Any) -> None:
        self.reader = InMemoryMetricReader()
        self.meters = MeterProvider(metric_readers=[self.reader])
        self.spans = InMemorySpanExporter()
        self.tracers = TracerProvider()
        self.tracers.add_span_processor(SimpleSpanProcessor(self.spans))
        self.hook: OTelHook = instrument(
            meter_provider=self.meters, tracer_provider=kw.get("tracer_provider", self.tracers)
        )

    def points(self) -> dict[str, list[Any]]:
        """Every data point of every metric, by metric name."""
        found: dict[str, list[Any]] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                assert scope.scope.name == "retry_after_adapter"
                for metric in scope.metrics:
                    found.setdefault(metric.name, []).extend(metric.data.data_points)
        return found

    def counts(self, name: str) -> dict[frozenset[tuple[str, Any]], float]:
        return {frozenset(p.attributes.items()): p.value for p in self.points().get(name, [])}

    def close(self) -> None:
        self.hook.close()
        self.meters.shutdown()
        self.tracers.shutdown()


@pytest.fixture
def otel() -> Iterator[OTel]:
    made = OTel()
    yield made
    made.close()


def client(
    front: str, clock: FakeClock, store: Any, hook: Any, **kw: Any
) -> tuple[Callable[..., int], Callable[[], None]]:
    """``(get, close)``: ``get(url, headers=None)`` sends one GET through ``front``
    with the hook attached and returns the status."""
    retry_kw = {k: kw.pop(k) for k in list(kw) if k in ("total", "max_wait", "deadline")}
    retry = RetryAfterRetry(clock=clock, jitter=0, **{"total": 3, **retry_kw})
    if front == "requests":
        session = requests.Session()
        session.mount("http://", RetryAfterAdapter(retry, cooldown=store, on_decision=hook, **kw))
        return (lambda url, headers=None: session.get(url, headers=headers).status_code), session.close
    if front == "urllib3":
        manager = RetryAfterPoolManager(retries=retry, cooldown=store, on_decision=hook, **kw)
        return (lambda url, headers=None: manager.request("GET", url, headers=headers).status), manager.clear
    if front == "aiohttp":
        aiohttp = pytest.importorskip("aiohttp")
        from retry_after_adapter.aiohttp import RetryAfterMiddleware

        middleware = RetryAfterMiddleware(retry, cooldown=store, on_decision=hook, **kw)

        def fetch(url: str, headers: dict[str, str] | None = None) -> int:
            async def one() -> int:
                async with aiohttp.ClientSession(middlewares=(middleware,)) as session:
                    async with session.get(url, headers=headers) as response:
                        await response.read()
                        return int(response.status)

            return asyncio.run(one())

        return fetch, middleware.close
    library, transports = httpx, (RetryAfterTransport, AsyncRetryAfterTransport)
    if front.startswith("httpx2"):
        library = pytest.importorskip("httpx2")
        from retry_after_adapter import httpx2 as ours

        transports = (ours.RetryAfterTransport, ours.AsyncRetryAfterTransport)
    if not front.endswith("-async"):
        sync = library.Client(transport=transports[0](retry, cooldown=store, on_decision=hook, **kw))
        return (lambda url, headers=None: sync.get(url, headers=headers).status_code), sync.close
    transport = transports[1](retry, cooldown=store, on_decision=hook, **kw)

    def get(url: str, headers: dict[str, str] | None = None) -> int:
        async def one() -> int:
            async with library.AsyncClient(transport=transport) as session:
                return (await session.get(url, headers=headers)).status_code

        return asyncio.run(one())

    return get, lambda: None


def origin(server: ThrottleServer) -> set[tuple[str, Any]]:
    return {("server.address", "127.0.0.1"), ("server.port", server.port)}


@pytest.mark.parametrize("front", FRONTS)
def test_waits_deferrals_and_admissions_are_metrics_and_span_events(
    front: str, server: ThrottleServer, clock: FakeClock, otel: OTel
) -> None:
    store = MemoryCooldownStore()
    get, close = client(front, clock, store, otel.hook, max_wait=10, quota=Quota(2, per=5))
    tracer = otel.tracers.get_tracer("test")
    where = origin(server)
    try:
        # A 429 with a wait that fits: waited, resent, 200.
        server.serve([Reply(429, {"Retry-After": "2"}), Reply(200)])
        with tracer.start_as_current_span("waited"):
            assert get(server.url + "/a") == 200
        # Both permits of the quota's 5 s were taken at 0 s and 2 s: this one waits 3 s.
        server.serve([Reply(200)])
        with tracer.start_as_current_span("queued"):
            assert get(server.url + "/b") == 200
        clock.advance(10)
        # A 429 with a wait longer than max_wait: deferred with the response.
        server.serve([Reply(429, {"Retry-After": "120"})])
        with tracer.start_as_current_span("deferred"):
            assert get(server.url + "/c") == 429
        # That cooldown now holds the scope: the next call is deferred before sending.
        sent = server.count()
        with tracer.start_as_current_span("held"):
            assert get(server.url + "/d") == 429
        assert server.count() == sent
    finally:
        close()

    waits = {frozenset(p.attributes.items()): (p.count, p.sum) for p in otel.points()["retry_after.wait.duration"]}
    assert waits[frozenset({*where, ("retry_after.reason", "retry_after")})] == (1, 2.0)
    assert waits[frozenset({*where, ("retry_after.reason", "quota")})] == (1, pytest.approx(3.0, abs=0.01))
    assert otel.counts("retry_after.deferrals") == {
        frozenset({*where, ("retry_after.reason", "max_wait")}): 1,
        frozenset({*where, ("retry_after.reason", "cooldown")}): 1,
    }
    assert otel.counts("retry_after.admissions") == {
        frozenset({*where, ("retry_after.reason", "quota"), ("retry_after.outcome", "waited")}): 1,
        frozenset({*where, ("retry_after.reason", "cooldown"), ("retry_after.outcome", "deferred")}): 1,
    }
    histogram = next(p for p in otel.points()["retry_after.wait.duration"])
    assert 120.0 in histogram.explicit_bounds  # the advised buckets, in seconds

    spans = {span.name: span for span in otel.spans.get_finished_spans()}
    waited = spans["waited"]
    assert [event.name for event in waited.events] == ["retry_after.wait"]
    assert dict(waited.events[0].attributes) == {
        "retry_after.reason": "retry_after",
        "retry_after.wait.duration": 2.0,
        "retry_after.server_delay": 2.0,
        "http.response.status_code": 429,
        "retry_after.attempts": 1,
    }
    assert waited.attributes["http.request.resend_count"] == 1
    queued = spans["queued"]
    assert [event.name for event in queued.events] == ["retry_after.wait"]
    assert queued.events[0].attributes["retry_after.reason"] == "quota"
    assert "http.request.resend_count" not in queued.attributes  # a first send is no resend
    deferred = spans["deferred"]
    assert [event.name for event in deferred.events] == ["retry_after.deferral"]
    assert deferred.events[0].attributes["retry_after.reason"] == "max_wait"
    assert deferred.events[0].attributes["retry_after.delay"] == pytest.approx(120, abs=1)
    assert "http.request.resend_count" not in deferred.attributes
    held = spans["held"]
    assert [(e.name, e.attributes["retry_after.reason"]) for e in held.events] == [
        ("retry_after.deferral", "cooldown")
    ]


@pytest.mark.parametrize("front", FRONTS)
def test_every_resend_sets_the_resend_count(front: str, server: ThrottleServer, clock: FakeClock, otel: OTel) -> None:
    get, close = client(front, clock, MemoryCooldownStore(), otel.hook, total=5)
    server.serve([Reply(503, {"Retry-After": "1"}), Reply(503), Reply(429, {"Retry-After": "1"}), Reply(200)])
    try:
        with otel.tracers.get_tracer("test").start_as_current_span("GET"):
            assert get(server.url + "/") == 200
    finally:
        close()
    [span] = otel.spans.get_finished_spans()
    assert span.attributes["http.request.resend_count"] == 3
    reasons = [e.attributes["retry_after.reason"] for e in span.events]
    assert reasons == ["retry_after", "backoff", "retry_after"]
    assert [e.attributes["retry_after.attempts"] for e in span.events] == [1, 2, 3]


@pytest.mark.parametrize("front", FRONTS)
def test_no_secret_reaches_an_attribute_an_event_or_a_log_record_at_debug(
    front: str, server: ThrottleServer, clock: FakeClock, otel: OTel
) -> None:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    keep = Keep(logging.DEBUG)
    root = logging.getLogger()
    level = root.level
    root.addHandler(keep)
    root.setLevel(logging.DEBUG)
    redact_logs()
    get, close = client(front, clock, MemoryCooldownStore(), otel.hook, max_wait=10)
    url = f"http://user:{PASSWORD}@127.0.0.1:{server.port}/{PATH}/items?token={QUERY}&page=2"
    # aiohttp refuses an Authorization header beside user info: it sends the user info.
    headers = None if front == "aiohttp" else {"Authorization": f"Bearer {TOKEN}"}
    try:
        with otel.tracers.get_tracer("test").start_as_current_span("GET"):
            server.serve([Reply(429, {"Retry-After": "1"}), Reply(503), Reply(429, {"Retry-After": "90"})])
            assert get(url, headers) == 429  # a wait, a backoff, then deferred
            assert get(url, headers) == 429  # deferred before sending: the cooldown
    finally:
        close()
        root.removeHandler(keep)
        root.setLevel(level)
        remove_log_redaction()
    sent = " ".join(f"{s.path} {s.headers.get('Authorization')}" for s in server.seen)
    assert QUERY in sent and (TOKEN in sent or BASIC in sent)  # the secrets were sent

    exported: list[str] = []
    for name, points in otel.points().items():
        for point in points:
            assert set(point.attributes) <= METRIC_KEYS, (name, point.attributes)
            for key, value in point.attributes.items():
                assert type(value) in (str, int), (key, value)  # plain values, not enums
                if key in ("retry_after.reason", "retry_after.outcome"):
                    assert value in REASONS | set(ADMISSION_OUTCOMES)
            exported.append(f"{name} {dict(point.attributes)}")
    for span in otel.spans.get_finished_spans():
        exported.append(f"{span.name} {dict(span.attributes or {})}")
        exported.extend(f"{event.name} {dict(event.attributes or {})}" for event in span.events)
    assert PATH not in "\n".join(exported)  # no path in what is exported (urllib3 logs it)
    for record in records:
        exported.append(record.getMessage())
        exported.extend(repr(value) for value in vars(record).values())
    text = "\n".join(exported)
    assert "retry_after.deferrals" in text and "retry_after.wait" in text and "127.0.0.1" in text
    assert any(r.name == "retry_after_adapter" and r.levelno == logging.DEBUG for r in records)
    for secret in SECRETS:
        assert secret not in text, secret


def test_only_an_origin_gives_server_attributes() -> None:
    assert origin_attributes("https://api.example.com:443") == (
        ("server.address", "api.example.com"),
        ("server.port", 443),
    )
    assert origin_attributes("https://api.example.com:443|sha256:0123456789abcdef0123456789abcdef") == (
        ("server.address", "api.example.com"),
        ("server.port", 443),
    )
    assert origin_attributes("http://[::1]:8080") == (("server.address", "::1"), ("server.port", 8080))
    assert origin_attributes("https://api.example.com") == (
        ("server.address", "api.example.com"),
        ("server.port", 443),
    )
    for scope in (
        None,
        "",
        "sha256:0123456789abcdef0123456789abcdef",
        "github",
        "https://user:pw@api.example.com:443",
        "https://api.example.com:443/v1/items",
        "https://api.example.com:443?token=x",
        "https://user:pw@api.example.com:443|sha256:0123",
        "https://api.example.com:443#frag",
        "ftp://api.example.com:21",
        "https://api.example.com:99999",
        "https://",
    ):
        assert origin_attributes(scope) == (), scope


def test_a_named_or_hashed_scope_gives_no_server_attributes(
    server: ThrottleServer, clock: FakeClock, otel: OTel
) -> None:
    store = MemoryCooldownStore()
    for scope in (public_scope(lambda request: "team-quota"), lambda request: "account-42"):
        get, close = client("requests", clock, store, otel.hook, max_wait=1, scope=scope)
        server.serve([Reply(429, {"Retry-After": "30"})])
        try:
            assert get(server.url + "/") == 429
        finally:
            close()
    assert otel.counts("retry_after.deferrals") == {frozenset({("retry_after.reason", "max_wait")}): 2}


def test_values_outside_the_fixed_sets_are_other(otel: OTel) -> None:
    """A hook handed a record it does not know (another hook's, an older version's)
    records it under ``other`` and never raises."""
    hook = otel.hook
    hook(DecisionRecord("defer", "made-up", 5.0, "https://a.example:443", 429, 1))  # type: ignore[arg-type]
    hook(DecisionRecord("retry", "made-up", float("nan"), None, None, 0))  # type: ignore[arg-type]
    hook(DecisionRecord("stop", None, 0.0, None, 500, 2))
    hook(DecisionRecord("jump", None, 0.0, None, None, 0))
    assert otel.counts("retry_after.deferrals") == {
        frozenset({("retry_after.reason", "other"), ("server.address", "a.example"), ("server.port", 443)}): 1
    }
    [point] = otel.points()["retry_after.wait.duration"]
    assert dict(point.attributes) == {"retry_after.reason": "other"} and point.sum == 0.0
    assert dict(next(iter(otel.counts("retry_after.admissions")))) == {
        "retry_after.reason": "other",
        "retry_after.outcome": "waited",
    }


def test_store_outages_are_counted_by_a_bounded_cause(
    real_server: ThrottleServer, otel: OTel, caplog: pytest.LogCaptureFixture
) -> None:
    from retry_after_adapter import RedisCooldownStore

    pytest.importorskip("redis")
    with closed_port() as port:
        store = RedisCooldownStore.from_url(f"redis://127.0.0.1:{port}/0")
        session = requests.Session()
        session.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=0), cooldown=store, on_decision=otel.hook))
        try:
            assert session.get(real_server.url + "/").status_code == 200  # fails open
        finally:
            session.close()
    # A store of one's own may name any cause: it is counted as another cause.
    logging.getLogger("retry_after_adapter").warning(
        "cooldown store failed", extra={"store": "MyStore", "cause": f"bad token {TOKEN}", "lasting": False}
    )
    assert otel.counts("retry_after.store.failures") == {
        frozenset({("retry_after.cause", "connection refused")}): 1,
        frozenset({("retry_after.cause", "other")}): 1,
    }
    otel.hook.close()
    otel.hook.close()  # idempotent
    logging.getLogger("retry_after_adapter").warning("again", extra={"store": "S", "cause": "timed out"})
    assert sum(otel.counts("retry_after.store.failures").values()) == 2  # closed: no longer counted


def test_a_no_op_tracer_provider_keeps_the_metrics_only(server: ThrottleServer, clock: FakeClock) -> None:
    otel = OTel(tracer_provider=trace.NoOpTracerProvider())
    try:
        assert otel.hook.spans is False
        get, close = client("requests", clock, MemoryCooldownStore(), otel.hook)
        server.serve([Reply(429, {"Retry-After": "1"}), Reply(200)])
        try:
            with otel.tracers.get_tracer("test").start_as_current_span("GET"):
                assert get(server.url + "/") == 200
        finally:
            close()
        [span] = otel.spans.get_finished_spans()
        assert not span.events and "http.request.resend_count" not in span.attributes
        assert otel.points()["retry_after.wait.duration"][0].count == 1
    finally:
        otel.close()


def test_without_a_span_or_a_provider_the_hook_costs_nothing_and_says_nothing(
    server: ThrottleServer, clock: FakeClock
) -> None:
    """The global providers are no-ops until the application sets one: the hook works."""
    hook = instrument()
    try:
        get, close = client("requests", clock, MemoryCooldownStore(), hook)
        server.serve([Reply(429, {"Retry-After": "1"}), Reply(200)])
        try:
            assert get(server.url + "/") == 200
        finally:
            close()
    finally:
        hook.close()


def prometheus_names(otel: OTel) -> tuple[set[str], set[str]]:
    """The series and label names Prometheus gives what the hook exported, under the
    default translation (dots to underscores, the unit ``s`` as ``_seconds``, curly
    annotations dropped, ``_total`` on counters, a histogram's three series)."""
    series: set[str] = set()
    labels = {"le"}
    data = otel.reader.get_metrics_data()
    assert data is not None
    for metric in data.resource_metrics[0].scope_metrics[0].metrics:
        name = metric.name.replace(".", "_") + ("_seconds" if metric.unit == "s" else "")
        if type(metric.data).__name__ == "Histogram":
            series.update(name + suffix for suffix in ("_bucket", "_sum", "_count"))
        else:
            series.add(name + "_total")
        for point in metric.data.data_points:
            labels.update(key.replace(".", "_") for key in point.attributes)
    return series, labels


def test_the_dashboard_and_the_docs_query_what_the_hook_exports(
    server: ThrottleServer, real_server: ThrottleServer, clock: FakeClock, otel: OTel
) -> None:
    import json
    import re
    from pathlib import Path

    from retry_after_adapter import RedisCooldownStore

    docs = Path(__file__).resolve().parents[2] / "docs"
    # Every metric at least once: a wait, a deferral, an admission deferred, an outage.
    get, close = client("requests", clock, MemoryCooldownStore(), otel.hook, max_wait=10)
    server.serve([Reply(429, {"Retry-After": "1"}), Reply(429, {"Retry-After": "60"})])
    try:
        assert get(server.url + "/") == 429
        assert get(server.url + "/") == 429
    finally:
        close()
    with closed_port() as port:
        session = requests.Session()
        down = RedisCooldownStore.from_url(f"redis://127.0.0.1:{port}/0")
        session.mount("http://", RetryAfterAdapter(RetryAfterRetry(total=0), cooldown=down, on_decision=otel.hook))
        try:
            session.get(real_server.url + "/")
        finally:
            session.close()
    series, labels = prometheus_names(otel)
    assert len(series) == 6, series

    dashboard = json.loads((docs / "grafana" / "retry-after-adapter.json").read_text(encoding="utf-8"))
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    page = (docs / "observability.md").read_text(encoding="utf-8")
    [promql] = re.findall(r"^```promql\n(.*?)^```", page, re.S | re.M)
    assert [line for line in promql.splitlines() if not line.startswith("#")] == exprs
    for expr in exprs:
        for name in re.findall(r"\b(retry_after_\w+_(?:total|bucket|sum|count))\b", expr):
            assert name in series, (name, series)
        for group in re.findall(r"by \(([^)]*)\)", expr):
            for label in (part.strip() for part in group.split(",")):
                assert label in labels, (label, labels)
    mentioned = set(re.findall(r"\b(retry_after_\w+_(?:total|bucket|sum))\b", " ".join(exprs)))
    assert {s for s in series if not s.endswith("_count")} == mentioned  # every metric has a panel


def test_an_application_without_logging_still_sees_the_outage_warning(tmp_path: Any) -> None:
    """The hook counts store outages without a log handler of its own: one would stop
    Python's last-resort handler from printing the warning where nothing is set up."""
    import subprocess
    import sys

    script = tmp_path / "app.py"
    script.write_text(
        "import requests\n"
        "from retry_after_adapter import RedisCooldownStore, RetryAfterAdapter, RetryAfterRetry\n"
        "from retry_after_adapter.otel import instrument\n"
        "from retry_after_adapter.testing import QuotaServer\n"
        "from retry_after_adapter.testing.ports import closed_port\n"
        "hook = instrument()\n"
        "with QuotaServer(quota=10, window=60) as server, closed_port() as port:\n"
        "    store = RedisCooldownStore.from_url(f'redis://127.0.0.1:{port}/0')\n"
        "    session = requests.Session()\n"
        "    session.mount('http://', RetryAfterAdapter(RetryAfterRetry(total=0), cooldown=store, on_decision=hook))\n"
        "    assert session.get(server.url + '/').status_code == 200\n"
        "    session.close()\n",
        encoding="utf-8",
    )
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "cooldown store RedisCooldownStore failed: connection refused" in proc.stderr


def test_the_credential_scope_gives_its_origin_and_nothing_of_the_credential(
    server: ThrottleServer, clock: FakeClock, otel: OTel
) -> None:
    get, close = client("requests", clock, MemoryCooldownStore(), otel.hook, max_wait=1, scope="credential")
    server.serve([Reply(429, {"Retry-After": "30"})])
    try:
        assert get(server.url + "/", {"Authorization": f"Bearer {TOKEN}"}) == 429
    finally:
        close()
    assert otel.counts("retry_after.deferrals") == {frozenset({*origin(server), ("retry_after.reason", "max_wait")}): 1}


def test_a_wait_for_a_concurrency_slot_is_one_wait_of_its_length(server: ThrottleServer, otel: OTel) -> None:
    """``max_concurrency=1`` and two GETs: the second looks for the slot every 50 ms while
    the first is on the wire (held there about 0.3 s), then goes. Its looks are not
    decisions, but its admission is one wait (reason ``concurrency``) of the time it
    looked, on the real clock."""
    import threading
    import time

    gate = threading.Event()
    server.serve([Reply(200, gate=gate), Reply(200)])
    session = requests.Session()
    session.mount(
        "http://",
        RetryAfterAdapter(RetryAfterRetry(total=2, max_wait=5), cooldown=MemoryCooldownStore(),
                          max_concurrency=1, on_decision=otel.hook),
    )
    first = threading.Thread(target=lambda: session.get(server.url + "/first"))
    first.start()
    deadline = time.monotonic() + 5
    while server.count() < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    threading.Timer(0.3, gate.set).start()
    assert session.get(server.url + "/second").status_code == 200
    first.join(5)
    waits = [p for p in otel.points()["retry_after.wait.duration"]
             if dict(p.attributes)["retry_after.reason"] == "concurrency"]
    assert len(waits) == 1 and waits[0].count == 1 and 0.2 <= waits[0].sum <= 3.0, waits
    waited = otel.counts("retry_after.admissions")
    assert waited == {frozenset({*origin(server), ("retry_after.reason", "concurrency"),
                                 ("retry_after.outcome", "waited")}): 1}
