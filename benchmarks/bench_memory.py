"""Memory: does the resident set grow with the number of calls through one adapter?

One Session, one adapter, GETs to a keep-alive ``200 ok`` server on loopback (its own
process), each to a different path (``/m/<n>``). RSS (VmRSS from /proc/self/status,
KiB) is sampled after 10,000, 50,000 and 100,000 calls, and the growth is reported
per 10,000 calls between the first and the last sample:
``(rss(100k) - rss(10k)) / 9``. The same is done for a stock session
(``HTTPAdapter(max_retries=Retry(...))``). Each measurement runs in a fresh interpreter
(a child process), so neither variant inherits the other's heap; the two children of a
repetition run at the same time (RSS is per process). The table quotes medians over
``--reps`` repetitions with min-max.

    python benchmarks/bench_memory.py            # full: 100,000 calls, 3 repetitions
    python benchmarks/bench_memory.py --quick    # 5,000 calls, 1 repetition
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lib import common as _common


def child(variant: str, url: str, samples: list[int]) -> dict[str, Any]:
    """Run in the child process: make the calls, return RSS at each sample (KiB)."""
    import requests
    from requests.adapters import HTTPAdapter
    from urllib3.util.retry import Retry

    from retry_after_adapter import RetryAfterAdapter, RetryAfterRetry

    statuses = (429, 502, 503, 504)
    session = requests.Session()
    if variant == "stock":
        adapter: HTTPAdapter = HTTPAdapter(
            max_retries=Retry(total=5, backoff_factor=0.5, status_forcelist=statuses)
        )
    else:
        retry = RetryAfterRetry(total=5, backoff_factor=0.5, status_forcelist=statuses, deadline=30)
        adapter = RetryAfterAdapter(max_retries=retry)
    session.mount("http://", adapter)
    session.get(url + "/warmup", timeout=10).raise_for_status()
    rss = {"0": _common.rss_kib()}
    start = time.perf_counter()
    done = 0
    for target in samples:
        while done < target:
            response = session.get(f"{url}/m/{done}", timeout=10)
            if response.status_code != 200:
                raise RuntimeError(f"unexpected status {response.status_code}")
            done += 1
        rss[str(target)] = _common.rss_kib()
    session.close()
    return {"rss_kib": rss, "seconds": time.perf_counter() - start}


def run_children(variants: list[str], url: str, samples: list[int]) -> dict[str, dict[str, Any]]:
    """Run one child per variant, at the same time (RSS is per process, so they do not
    disturb each other's figures; this halves the run time). Bounded to 30 minutes."""
    procs = {
        variant: subprocess.Popen(
            [sys.executable, str(Path(__file__)), "--child", variant, url, ",".join(map(str, samples))],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for variant in variants
    }
    results: dict[str, dict[str, Any]] = {}
    try:
        for variant, proc in procs.items():
            out, err = proc.communicate(timeout=1800)
            if proc.returncode != 0:
                raise RuntimeError(f"memory child {variant} failed:\n{err}")
            results[variant] = json.loads(out.strip().splitlines()[-1])
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    return results


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--child":
        samples = [int(n) for n in sys.argv[4].split(",")]
        print(json.dumps(child(sys.argv[2], sys.argv[3], samples)))
        return
    p = _common.parser(__doc__ or "")
    p.add_argument("--calls", type=int, help="calls per run (default 100000; quick 5000)")
    p.add_argument("--reps", type=int, help="repetitions (default 3; quick 1)")
    args = p.parse_args()
    calls = args.calls or (5_000 if args.quick else 100_000)
    reps = args.reps or (1 if args.quick else 3)
    samples = sorted({calls // 10, calls // 2, calls})
    first, last = samples[0], samples[-1]
    load_at_start = _common.loadavg()

    runs: dict[str, list[dict[str, Any]]] = {"stock": [], "adapter": []}
    with _common.ok_server() as server:
        for rep in range(reps):
            for variant, result in run_children(["stock", "adapter"], server.url, samples).items():
                rss = result["rss_kib"]
                result["growth_kib_per_10k_calls"] = (
                    (rss[str(last)] - rss[str(first)]) / (last - first) * 10_000
                )
                runs[variant].append(result)
                print(
                    f"rep {rep + 1}/{reps} {variant}: RSS KiB {rss}, "
                    f"growth {result['growth_kib_per_10k_calls']:.1f} KiB per 10k calls",
                    flush=True,
                )

    report: dict[str, Any] = {}
    rows = []
    for variant, results in runs.items():
        entry = {
            "rss_kib": {
                str(n): _common.summary([r["rss_kib"][str(n)] for r in results]) for n in [0, *samples]
            },
            "growth_kib_per_10k_calls": _common.summary([r["growth_kib_per_10k_calls"] for r in results]),
            "us_per_call_informational": _common.summary([r["seconds"] / calls * 1e6 for r in results]),
            "runs": results,
        }
        report[variant] = entry
        rows.append(
            [variant]
            + [_common.fmt_summary(entry["rss_kib"][str(n)], 0) for n in [0, *samples]]
            + [_common.fmt_summary(entry["growth_kib_per_10k_calls"], 1)]
        )
    tables = [
        _common.table(
            f"RSS (KiB) after N calls through one session, {reps} repetition(s), median [min-max]; "
            f"growth per 10,000 calls between {first:,} and {last:,}",
            ["variant", "after warm-up", *[f"{n:,} calls" for n in samples], "growth KiB / 10k calls"],
            rows,
        )
    ]
    payload = {
        "settings": {"calls": calls, "samples": samples, "reps": reps, "quick": args.quick},
        "loadavg_at_start": load_at_start,
        "variants": report,
    }
    _common.finish("memory", payload, tables, args.out)


if __name__ == "__main__":
    main()
