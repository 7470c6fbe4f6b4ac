"""Retry-After parsing: ``retry_after_adapter.parse_retry_after`` vs urllib3's
``Retry().parse_retry_after``.

Cases (the value is parsed again and again; the stock method gets the same string):

- ``seconds "120"``: delay-seconds. Target: ratio <= 1.0.
- ``IMF-fixdate``: a date two minutes ahead, e.g. ``Sun, 06 Nov 2033 08:49:37 GMT``.
  Target: ratio <= 0.5.

Diagnostic rows (no target): delay-seconds with many distinct values (so a cache of
recent values cannot help); each case with ``received_at=datetime.now(timezone.utc)``
read per call, which is what the retry loop pays; the date form with the response's
``Date`` header given (measured against it); and ``RetryAfterRetry().parse_retry_after``,
the drop-in counterpart of the stock method (it reads the clock itself).

Method: each repetition times ``number`` calls of ours, then of stock, on the same value
(the order alternates between repetitions), in CPU time of this process
(``time.process_time``: parsing is pure computation, and CPU time is not inflated when
other processes take the cores); the ratio of a repetition is ours / stock. The table
quotes medians over ``--repeat`` repetitions with min-max.

    python benchmarks/bench_parse.py            # full: 31 repetitions of ~40 ms each
    python benchmarks/bench_parse.py --quick    # well under a second
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from lib import common as _common
from urllib3.util.retry import Retry

from retry_after_adapter import RetryAfterRetry, parse_retry_after

TARGETS = {"seconds": 1.0, "date": 0.5}


def http_date(moment: datetime) -> str:
    return moment.strftime("%a, %d %b %Y %H:%M:%S GMT")


def calibrate(fn: Callable[[], object], seconds: float) -> int:
    """How many calls of ``fn`` take about ``seconds``."""
    n = 1
    while True:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        took = time.perf_counter() - start
        if took >= seconds / 10 or n >= 10**7:
            return max(1, int(n * seconds / max(took, 1e-9)))
        n *= 10


def timed(fn: Callable[[], object], number: int) -> float:
    """CPU seconds of this process for ``number`` calls: parsing is pure computation, and
    CPU time leaves out the time the OS gave to other processes meanwhile."""
    start = time.process_time()
    for _ in range(number):
        fn()
    return time.process_time() - start


def compare(
    ours: Callable[[], object], stock: Callable[[], object], repeat: int, seconds: float
) -> dict[str, Any]:
    """Per-call microseconds of each and the per-repetition ratio ours / stock."""
    number = calibrate(stock, seconds)
    timed(ours, number // 10 + 1)  # warm caches the same way for both
    timed(stock, number // 10 + 1)
    a: list[float] = []
    b: list[float] = []
    for r in range(repeat):
        if r % 2 == 0:
            a.append(timed(ours, number))
            b.append(timed(stock, number))
        else:
            b.append(timed(stock, number))
            a.append(timed(ours, number))
    return {
        "number": number,
        "ours_us": _common.summary([t / number * 1e6 for t in a]),
        "stock_us": _common.summary([t / number * 1e6 for t in b]),
        "ratio": _common.summary(_common.ratios(a, b)),
    }


def cases() -> dict[str, tuple[str, Callable[[], object], Callable[[], object]]]:
    """name -> (form, ours, stock)."""
    stock = Retry(total=5)
    ours_retry = RetryAfterRetry(total=5, max_wait=None)
    now = datetime.now(timezone.utc)
    future = http_date(now + timedelta(seconds=120))
    server_date = http_date(now)
    utc = timezone.utc
    distinct = [str(1_000_000 + n) for n in range(20_000)]
    it_ours = iter(())
    it_stock = iter(())

    def ours_distinct() -> object:
        nonlocal it_ours
        try:
            value = next(it_ours)
        except StopIteration:
            it_ours = iter(distinct)
            value = next(it_ours)
        return parse_retry_after(value, received_at=now)

    def stock_distinct() -> object:
        nonlocal it_stock
        try:
            value = next(it_stock)
        except StopIteration:
            it_stock = iter(distinct)
            value = next(it_stock)
        return stock.parse_retry_after(value)

    return {
        'seconds "120"': (
            "seconds",
            lambda: parse_retry_after("120", received_at=now),
            lambda: stock.parse_retry_after("120"),
        ),
        "IMF-fixdate": (
            "date",
            lambda: parse_retry_after(future, received_at=now),
            lambda: stock.parse_retry_after(future),
        ),
        "seconds, 20000 distinct values": ("diagnostic", ours_distinct, stock_distinct),
        'seconds "120", clock read per call': (
            "diagnostic",
            lambda: parse_retry_after("120", received_at=datetime.now(utc)),
            lambda: stock.parse_retry_after("120"),
        ),
        "IMF-fixdate, clock read per call": (
            "diagnostic",
            lambda: parse_retry_after(future, received_at=datetime.now(utc)),
            lambda: stock.parse_retry_after(future),
        ),
        "IMF-fixdate with Date header": (
            "diagnostic",
            lambda: parse_retry_after(future, received_at=now, date=server_date),
            lambda: stock.parse_retry_after(future),
        ),
        'RetryAfterRetry().parse_retry_after("120")': (
            "diagnostic",
            lambda: ours_retry.parse_retry_after("120"),
            lambda: stock.parse_retry_after("120"),
        ),
        "RetryAfterRetry().parse_retry_after(IMF-fixdate)": (
            "diagnostic",
            lambda: ours_retry.parse_retry_after(future),
            lambda: stock.parse_retry_after(future),
        ),
    }


def main() -> None:
    p = _common.parser(__doc__ or "")
    p.add_argument("--repeat", type=int, help="repetitions per case (default 31; quick 5)")
    args = p.parse_args()
    repeat = args.repeat or (5 if args.quick else 31)
    seconds = 0.005 if args.quick else 0.04
    load_at_start = _common.loadavg()

    results: dict[str, Any] = {}
    for name, (form, ours, stock) in cases().items():
        ours()  # a broken parser fails here, loudly, rather than being timed
        stock()
        results[name] = {"form": form, **compare(ours, stock, repeat, seconds)}
        target = TARGETS.get(form)
        if target is not None:
            results[name]["target_ratio"] = target
            results[name]["meets_target"] = results[name]["ratio"]["median"] <= target

    rows = []
    for name, r in results.items():
        target = r.get("target_ratio")
        rows.append(
            [
                name,
                _common.fmt_summary(r["ours_us"], 2),
                _common.fmt_summary(r["stock_us"], 2),
                _common.fmt_summary(r["ratio"], 3),
                "-" if target is None else f"<= {target} " + ("met" if r["meets_target"] else "MISSED"),
            ]
        )
    tables = [
        _common.table(
            f"Retry-After parsing, us per call ({repeat} repetitions, median [min-max])",
            ["case", "retry_after_adapter", "urllib3 Retry", "ratio", "target"],
            rows,
        )
    ]
    payload = {
        "settings": {"repeat": repeat, "seconds_per_repetition": seconds, "quick": args.quick},
        "loadavg_at_start": load_at_start,
        "cases": results,
    }
    _common.finish("parse", payload, tables, args.out)


if __name__ == "__main__":
    main()
