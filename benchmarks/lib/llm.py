"""The SDK side of the LLM benchmarks (``bench_llm.py``, ``bench_tokens.py``): the
OpenAI and Anthropic clients over a transport on a shared store (or plain), what a
rate-limit error says to wait, and the workers that call them (threads, asyncio tasks,
a fleet process) with the tally of what they got back."""

from __future__ import annotations

import asyncio
import email.utils
import threading
import time
from datetime import datetime, timezone
from typing import Any

from .common import open_store

SDKS = ("openai", "anthropic")


def missing_sdks(sdks: list[str]) -> dict[str, str]:
    """The SDKs that cannot run here, and why."""
    why: dict[str, str] = {}
    for name in ("httpx2", *sdks):
        try:
            __import__(name)
        except ImportError as exc:
            why[name] = f"{name} is not installed ({exc})"
    if "httpx2" in why:
        return {sdk: why["httpx2"] for sdk in sdks}
    return {sdk: why[sdk] for sdk in sdks if sdk in why}


def sdk_client(sdk: str, url: str, http: Any) -> Any:
    """The SDK's sync client with its defaults (``max_retries=2``), on ``http``."""
    if sdk == "openai":
        import openai

        return openai.OpenAI(api_key="sk-bench", base_url=url + "/v1", http_client=http)
    import anthropic

    return anthropic.Anthropic(api_key="sk-ant-bench", base_url=url, http_client=http)


def async_sdk_client(sdk: str, url: str, http: Any) -> Any:
    if sdk == "openai":
        import openai

        return openai.AsyncOpenAI(api_key="sk-bench", base_url=url + "/v1", http_client=http)
    import anthropic

    return anthropic.AsyncAnthropic(api_key="sk-ant-bench", base_url=url, http_client=http)


def rate_limit_error(sdk: str) -> type[Exception]:
    module: Any = __import__(sdk)
    return module.RateLimitError  # type: ignore[no-any-return]


def api_error(sdk: str) -> type[Exception]:
    module: Any = __import__(sdk)
    return module.APIError  # type: ignore[no-any-return]


def http_client(store: Any) -> Any:
    """A plain ``httpx2.Client()`` (``store`` None), or one over
    ``RetryAfterTransport(cooldown=store)``."""
    import httpx2

    if store is None:
        return httpx2.Client()
    from retry_after_adapter.httpx2 import RetryAfterTransport

    return httpx2.Client(transport=RetryAfterTransport(cooldown=store))


def wait_after(error: Exception, now: datetime | None = None) -> tuple[float, bool]:
    """Seconds to wait before calling again after ``error`` (a ``RateLimitError``), and
    whether it carried a deferral: until the deferral's ``eligible_at``; else what the
    429 said (``retry-after-ms``, ``Retry-After`` in seconds or as a date), 1 s when
    it said nothing."""
    from retry_after_adapter import deferral_of

    now = now or datetime.now(timezone.utc)
    deferral = deferral_of(error)
    if deferral is not None:
        return max(0.0, (deferral.eligible_at - now).total_seconds()), True
    headers = getattr(getattr(error, "response", None), "headers", None) or {}
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            return max(0.0, float(value) / scale), False
        except ValueError:
            parsed = email.utils.parsedate_to_datetime(value) if name == "retry-after" else None
            if parsed is not None:
                return max(0.0, (parsed - now).total_seconds()), False
    return 1.0, False


class Tally:
    """What a group of workers did: calls done, their end times, errors caught."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = 0
        self.last_done: float | None = None
        self.rate_limited = 0
        self.deferred = 0
        self.other_errors: list[str] = []

    def ok(self) -> None:
        with self.lock:
            self.done += 1
            self.last_done = time.monotonic()

    def limited(self, deferred: bool) -> None:
        with self.lock:
            self.rate_limited += 1
            self.deferred += deferred

    def failed(self, error: BaseException) -> None:
        with self.lock:
            self.other_errors.append(f"{type(error).__name__}: {error}"[:200])

    def as_dict(self) -> dict[str, Any]:
        return {
            "done": self.done,
            "last_done": self.last_done,
            "rate_limited": self.rate_limited,
            "deferred": self.deferred,
            "other_errors": self.other_errors[:5],
            "other_error_count": len(self.other_errors),
        }


def list_models(client: Any) -> Any:
    """The fleets' call: ``client.models.list()`` (an empty model list from the stand-in)."""
    return client.models.list()


def sync_worker(
    sdk: str, client: Any, calls: int, stop_at: float, tally: Tally, call: Any = list_models
) -> None:
    """``calls`` calls of ``call(client)`` (default :func:`list_models`), each tried
    again after a ``RateLimitError`` once :func:`wait_after` says so; stops at
    ``stop_at``."""
    limited, other = rate_limit_error(sdk), api_error(sdk)
    done = 0
    while done < calls and time.monotonic() < stop_at:
        try:
            call(client)
        except limited as error:
            wait, deferred = wait_after(error)
            tally.limited(deferred)
            time.sleep(max(0.0, min(wait, stop_at - time.monotonic())))
            continue
        except other as error:  # anything else: noted, tried again shortly
            tally.failed(error)
            time.sleep(0.1)
            continue
        done += 1
        tally.ok()


async def async_worker(
    sdk: str, client: Any, calls: int, stop_at: float, tally: Tally, call: Any = list_models
) -> None:
    limited, other = rate_limit_error(sdk), api_error(sdk)
    done = 0
    while done < calls and time.monotonic() < stop_at:
        try:
            await call(client)
        except limited as error:
            wait, deferred = wait_after(error)
            tally.limited(deferred)
            await asyncio.sleep(max(0.0, min(wait, stop_at - time.monotonic())))
            continue
        except other as error:
            tally.failed(error)
            await asyncio.sleep(0.1)
            continue
        done += 1
        tally.ok()


def run_threads(
    sdk: str,
    clients: list[Any],
    threads: int,
    calls: int,
    start_at: float,
    limit: float,
    call: Any = list_models,
) -> Tally:
    """``threads`` workers, worker ``n`` on ``clients[n % len(clients)]``, from ``start_at``."""
    tally = Tally()
    stop_at = start_at + limit
    workers = [
        threading.Thread(
            target=sync_worker,
            args=(sdk, clients[n % len(clients)], calls, stop_at, tally, call),
            daemon=True,
        )
        for n in range(threads)
    ]
    time.sleep(max(0.0, start_at - time.monotonic()))
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(max(0.0, stop_at + 30 - time.monotonic()))
    return tally


def process_main(spec: dict[str, Any], messages: Any, start: Any, start_value: Any) -> None:
    """A fleet process: its own SDK client (over a transport on the shared store, or
    plain), ``spec["threads"]`` workers on it, from the start the parent sets."""
    try:
        store = open_store(*spec["store"]) if spec["store"] else None
        http = http_client(store)
        client = sdk_client(spec["sdk"], spec["url"], http)
        messages.put(("ready", spec["name"]))
        if not start.wait(120):
            messages.put(("error", spec["name"], "no start signal"))
            return
        tally = run_threads(
            spec["sdk"], [client], spec["threads"], spec["calls"], start_value.value, spec["limit"]
        )
        http.close()
        messages.put(("done", tally.as_dict()))
    except BaseException as exc:  # report, never leave the parent waiting
        messages.put(("error", spec["name"], f"{type(exc).__name__}: {exc}"))
        raise
