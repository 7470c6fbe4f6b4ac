"""Happy-path overhead in CPU instructions per GET: stock ``HTTPAdapter`` vs
``RetryAfterAdapter``, alone and with a ``Quota`` and ``max_concurrency`` that never bind,
and with that ``Quota`` alone (the path on which a refused permit would be reserved).

Wall-clock ratios on a small shared machine drift by a few percent between runs (see
``bench_happy_path.py``'s A/A control); instruction counts do not. Each variant runs in
its own process under valgrind's callgrind: ``--rounds`` warm-up GETs (at least 600,
past the learned rate's cold start), then ``--rounds`` measured GETs inside
``functools.reduce``, and only that call is collected
(``--toggle-collect=functools_reduce``; nothing else on the path calls it). The server
is the benchmarks' ``200 ok`` keep-alive server in its own process, outside valgrind;
every process gets the same environment and ``PYTHONHASHSEED=0``. Targets, median
ratio to stock over ``--repeats``: adapter <= 1.03; with a quota and a cap <= 1.05.

Needs valgrind (Debian: ``apt-get install valgrind``); without it the run says so and
writes a result marked skipped.

    python benchmarks/bench_instructions.py             # 300 GETs, 3 repeats (a few minutes)
    python benchmarks/bench_instructions.py --quick     # 20 GETs, 1 repeat
    python benchmarks/bench_instructions.py --otel      # also the adapters with the OpenTelemetry hook

``--otel`` adds each adapter variant with ``retry_after_adapter.otel.instrument()``
attached, on the SDK's meter and tracer providers (needs opentelemetry-sdk); target:
within 2 % of the same variant without it (``OTEL_TARGET``).
"""

from __future__ import annotations

import functools
import shutil
import sys
from typing import Any

from lib import common as _common

TARGET = 1.03
ADMISSION_TARGET = 1.05
VARIANTS = ("stock", "adapter", "adapter + Quota + max_concurrency", "adapter + Quota")
#: With ``--otel``: each adapter variant with the OpenTelemetry hook attached.
OTEL = " + OTel hook"
OTEL_VARIANTS = tuple(variant + OTEL for variant in VARIANTS[1:])
OTEL_TARGET = 1.02
#: The fewest warm-up GETs of a variant: past the cold start of the learned rate, whose
#: cap is lifted after about 500 good answers.
WARM_UP = 600


def child(variant: str, n: int, url: str, warm_up: int = WARM_UP) -> None:
    """One variant's process: ``max(n, warm_up)`` warm-up GETs, then ``n`` measured
    ones. A warm-up shorter than the learned rate's cold start (``--quick``) measures
    the adapters with the learned rate off, so that they are still in a steady state."""
    import requests
    from requests.adapters import HTTPAdapter

    from retry_after_adapter import Quota, RetryAfterAdapter

    session = requests.Session()
    hooks: Any = None
    if variant.endswith(OTEL):
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader
        from opentelemetry.sdk.trace import TracerProvider

        from retry_after_adapter.otel import instrument

        variant = variant[: -len(OTEL)]
        hooks = instrument(MeterProvider(metric_readers=[InMemoryMetricReader()]), TracerProvider())
    if variant == "stock":
        adapter: HTTPAdapter = HTTPAdapter()
    elif variant == "adapter":
        adapter = RetryAfterAdapter(learn_rate=warm_up >= WARM_UP, on_decision=hooks)
    elif variant == "adapter + Quota":  # no cap: a refused permit would be reserved
        adapter = RetryAfterAdapter(quota=Quota(1_000_000, per=1.0), on_decision=hooks)
    else:
        adapter = RetryAfterAdapter(quota=Quota(1_000_000, per=1.0), max_concurrency=8, on_decision=hooks)
    session.mount("http://", adapter)

    def get(count: int, _: int) -> int:
        response = session.get(url + "/")
        assert response.status_code == 200 and response.content == b"ok", response.status_code
        return count + 1

    count = 0
    # Warm-up, not collected (no reduce): at least WARM_UP GETs, past the learned rate's
    # cold start (its first few hundred answers of a scope are told to the store; that
    # one-off cost is bench_cold_start.py's to measure), so that every variant is
    # measured in its steady state.
    for i in range(max(n, warm_up)):
        count = get(count, i)
    assert functools.reduce(get, range(n), 0) == n  # measured: collected alone


def measure(variant: str, n: int, url: str, warm_up: int = WARM_UP) -> int:
    """Instructions of ``n`` warm GETs of ``variant`` (the collected reduce call)."""
    return _common.callgrind_collected(__file__, [variant, str(n), url, str(warm_up)], variant)


def main() -> None:
    parser = _common.parser(__doc__ or "")
    parser.add_argument("--rounds", type=int, default=300, help="measured GETs per variant (default 300)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of every variant (default 3)")
    parser.add_argument("--otel", action="store_true", help="also the adapters with the OpenTelemetry hook")
    args = parser.parse_args()
    variants = VARIANTS + OTEL_VARIANTS if args.otel else VARIANTS
    n, repeats = (20, 1) if args.quick else (args.rounds, args.repeats)
    payload: dict[str, Any] = {"settings": {"gets": n, "repeats": repeats}}
    if shutil.which("valgrind") is None:
        payload["skipped"] = "valgrind is not installed"
        _common.finish("instructions", payload, ["skipped: valgrind is not installed"], args.out)
        return
    per_get: dict[str, list[float]] = {variant: [] for variant in variants}
    with _common.ok_server() as server:
        for _ in range(repeats):
            for variant in variants:
                per_get[variant].append(measure(variant, n, server.url, 20 if args.quick else WARM_UP) / n)
    ratios = {variant: _common.ratios(per_get[variant], per_get["stock"]) for variant in variants}
    payload["instructions_per_get"] = {variant: _common.summary(per_get[variant]) for variant in variants}
    payload["ratio_vs_stock"] = {variant: _common.summary(ratios[variant]) for variant in variants}
    adapter = payload["ratio_vs_stock"]["adapter"]["median"]
    admission = payload["ratio_vs_stock"][VARIANTS[2]]["median"]
    payload.update(
        target_ratio=TARGET,
        adapter_ratio_median=adapter,
        meets_target=adapter <= TARGET,
        admission_target_ratio=ADMISSION_TARGET,
        admission_ratio_median=admission,
        admission_meets_target=admission <= ADMISSION_TARGET,
    )
    rows = [
        (
            variant,
            _common.fmt(payload["instructions_per_get"][variant]["median"] / 1e6, 4) + " M",
            _common.fmt_summary(payload["ratio_vs_stock"][variant], 4),
        )
        for variant in variants
    ]
    title = f"Instructions per GET ({n} warm GETs, {repeats} repeats; median [min-max])"
    tables = [_common.table(title, ("variant", "per GET", "ratio"), rows)]
    if args.otel:
        hooked = {
            variant: _common.summary(_common.ratios(per_get[variant + OTEL], per_get[variant]))
            for variant in VARIANTS[1:]
        }
        payload["otel_ratio_vs_without"] = hooked
        payload.update(
            otel_target_ratio=OTEL_TARGET,
            otel_meets_target=all(s["median"] <= OTEL_TARGET for s in hooked.values()),
        )
        rows = [(variant, _common.fmt_summary(hooked[variant], 4)) for variant in VARIANTS[1:]]
        tables.append(_common.table("With the OpenTelemetry hook / without", ("variant", "ratio"), rows))
    _common.finish("instructions", payload, tables, args.out)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5]))
    else:
        main()
