"""Run every benchmark, one after the other, each in its own interpreter.

Each benchmark prints its table(s) and JSON and writes ``<out>/<name>.json``; this
script passes ``--quick`` and ``--out`` through, then prints a one-line summary per
benchmark. A benchmark script that is not there is skipped with a message. Exits
non-zero when any benchmark fails.

    python benchmarks/run_all.py                 # everything, full size
    python benchmarks/run_all.py --quick         # a smoke run of each
    python benchmarks/run_all.py --only parse,memory
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lib import common as _common

#: name -> (script, JSON file it writes)
BENCHMARKS = {
    "happy_path": ("bench_happy_path.py", "happy_path.json"),
    "instructions": ("bench_instructions.py", "instructions.json"),
    "parse": ("bench_parse.py", "parse.json"),
    "fleet": ("bench_fleet.py", "fleet.json"),
    "memory": ("bench_memory.py", "memory.json"),
    "stores": ("bench_stores.py", "stores.json"),
    "memory_store": ("bench_memory_store.py", "memory_store.json"),
    "faults": ("bench_faults.py", "faults.json"),
    "push": ("bench_push.py", "bench_push.json"),
    "scopes": ("bench_scopes.py", "scopes.json"),
    "load": ("bench_load.py", "load.json"),
    "scale": ("bench_scale.py", "scale.json"),
    "reserve": ("bench_reserve.py", "reserve.json"),
    "priority": ("bench_priority.py", "priority.json"),
    "cold_start": ("bench_cold_start.py", "cold_start.json"),
    "httpx": ("bench_httpx.py", "bench_httpx.json"),
    "aiohttp": ("bench_aiohttp.py", "bench_aiohttp.json"),
    "scenarios": ("bench_scenarios.py", "scenarios.json"),
    "workers": ("bench_workers.py", "workers.json"),
}


def headline(name: str, doc: dict[str, Any]) -> str:
    """One line with the figures that matter most for ``name``."""
    if name == "happy_path":
        r = doc["variants"]["adapter"]["ratio_vs_stock"]
        line = f"adapter / stock per request: {_common.fmt_summary(r)} (target <= {doc['target_ratio']})"
        others = [
            f"{variant.removeprefix('adapter').lstrip(', ') or 'adapter'} {_common.fmt(v['ratio_median'])}"
            f" (<= {v['target']})"
            for variant, v in doc.get("targets", {}).items()
            if variant != "adapter"
        ]
        return "; ".join([line, *others])
    if name == "load":
        redis = doc["main"].get("Redis")
        if redis is None:
            return "; ".join(doc["skipped"]) or "no Redis row"
        return (
            f"Redis, {doc['settings']['processes']} x {doc['settings']['threads']}: "
            f"{_common.fmt(redis['round_trips_per_request']['median'])} round trips per request (<= 0.1), "
            f"throughput {_common.fmt(redis['ratio_vs_memory']['median'])} x memory's (>= 0.9)"
        )
    if name == "scale":
        parts = []
        for load_name, kinds in doc["flatness_8_to_256_workers"].items():
            if load_name == "binding":  # its cost follows the waiters, not the fleet's size
                continue
            for kind, spans in kinds.items():
                trips = spans.get("round_trips_per_request")
                if trips is not None:
                    parts.append(
                        f"{kind}, {load_name}: round trips per request x{trips:.2f} from 8 to 256 workers"
                    )
        worst = [s.get("worst_window", 0) for row in doc.get("binding", {}).values() for s in row.values()]
        parts.append(f"worst 1 s window {max(worst, default=0)} of {doc['settings']['binding_limit']}")
        return "; ".join(parts)
    if name == "instructions":
        if "skipped" in doc:
            return f"skipped: {doc['skipped']}"
        return (
            f"adapter / stock instructions per GET: {_common.fmt(doc['adapter_ratio_median'], 4)} "
            f"(target <= {doc['target_ratio']}); with a quota and a cap: "
            f"{_common.fmt(doc['admission_ratio_median'], 4)} (target <= {doc['admission_target_ratio']})"
        )
    if name == "parse":
        parts = []
        for case, r in doc["cases"].items():
            if "target_ratio" in r:
                parts.append(f"{case}: {_common.fmt_summary(r['ratio'])} (target <= {r['target_ratio']})")
        return "; ".join(parts)
    if name == "fleet":
        met: dict[str, list[int]] = {}
        for report in doc["shapes"].values():
            for entry in report["fleets"].values():
                for target, ok in entry.get("targets_met", {}).items():
                    met.setdefault(target, [0, 0])
                    met[target][0] += bool(ok)
                    met[target][1] += 1
        return "adapter fleets meeting each target: " + ", ".join(f"{t} {a}/{n}" for t, (a, n) in met.items())
    if name == "workers":
        parts = []
        for program, stores in doc["results"].items():
            for kind, runs in stores.items():
                walls = [r["wall_over_ideal"] for r in runs if r["wall_over_ideal"] is not None]
                lost = sum(r["lost_window"] for r in runs)
                median = _common.fmt(statistics.median(walls)) if walls else "-"
                parts.append(f"{program} on {kind}: wall {median} x ideal, window lost in {lost}/{len(runs)}")
        return "; ".join(parts)
    if name == "memory":
        return "; ".join(
            f"{v}: {_common.fmt_summary(e['growth_kib_per_10k_calls'], 1)} KiB per 10k calls"
            for v, e in doc["variants"].items()
        )
    if name == "memory_store":
        v = doc["variants"]["memory store"]
        return (
            f"{doc['scopes']:,} scopes: {_common.fmt_summary(v['extends_per_s'], 0)} extends/s, "
            f"get p99 {_common.fmt_summary(v['get_p99_us'], 2)} us"
        )
    if name == "scopes":
        parts = []
        for run_name, run in doc["runs"].items():
            last = run["checkpoints"][-1]
            ratio = _common.fmt(last["ratio_vs_first"], 2)
            parts.append(f"{run_name}: {ratio} x at {last['scopes']:,} scopes")
        return "p50 vs the first checkpoint: " + "; ".join(parts)
    if name == "httpx":
        parts = []
        for kind, variants in doc.get("happy", {}).items():
            ours = next(v for n, v in variants.items() if "RetryAfter" in n)
            parts.append(f"{kind} / plain per GET: {_common.fmt_summary(ours['ratio'])} (<= 1.05)")
        for variant, results in doc.get("fleet", {}).get("runs", {}).items():
            worst = max(r["wall_over_ideal"] or math.inf for r in results)
            parts.append(
                f"fleet {variant}: 429s <= {max(r['429'] for r in results)}, early <= "
                f"{max(r['early'] for r in results)}, wall <= {_common.fmt(worst)}"
            )
        return "; ".join(parts)
    if name == "aiohttp":
        parts = [
            f"{variant} / plain per GET: {_common.fmt_summary(v['cpu_ratio'])} (CPU)"
            for variant, v in doc.get("happy", {}).items()
            if "RetryAfter" in variant
        ]
        parts += [
            f"{variant}: 429s <= {max(r['429'] for r in runs)}, early <= {max(r['early'] for r in runs)}"
            for variant, runs in doc.get("runs", {}).items()
        ]
        return "; ".join(parts)
    if name == "priority":
        return "; ".join(
            f"{kind}: priority wait median {_common.fmt(row['priority_median_s'])} s, longest "
            f"{_common.fmt(row['priority_max_s'])} s (<= 0.08, < 0.5); ordinary "
            f"{_common.fmt(row['ordinary_median_s'])} s; worst second {row['worst_window']}"
            for kind, row in doc.get("rows", {}).items()
        )
    return "see its table above"


def main() -> None:
    p = _common.parser(__doc__ or "")
    p.add_argument("--only", help="comma-separated names: " + ", ".join(BENCHMARKS))
    args = p.parse_args()
    names = list(BENCHMARKS) if not args.only else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        p.error(f"unknown benchmark(s): {', '.join(unknown)}")

    args.out.mkdir(parents=True, exist_ok=True)
    summary: list[tuple[str, str, str]] = []
    failed = False
    for name in names:
        script, result_file = BENCHMARKS[name]
        path = _common.BENCH_DIR / script
        if not path.exists():
            print(f"== {name}: skipped ({script} is not there)", flush=True)
            summary.append((name, "skipped", f"{script} is not there"))
            continue
        command = [sys.executable, str(path)]
        if args.quick:
            command.append("--quick")
        # bench_stores.py names its output file; the others take a directory.
        command += ["--json", str(args.out / result_file)] if name == "stores" else ["--out", str(args.out)]
        print(f"== {name}: {' '.join(command[1:])}", flush=True)
        started = time.monotonic()
        rc = subprocess.run(command, check=False).returncode
        took = time.monotonic() - started
        if rc != 0:
            failed = True
            summary.append((name, f"FAILED (exit {rc})", f"{took:.0f} s"))
            continue
        result = args.out / result_file
        try:
            doc = json.loads(Path(result).read_text(encoding="utf-8"))
            line = headline(name, doc)
        except (OSError, ValueError, KeyError) as exc:
            line = f"(no summary: {type(exc).__name__})"
        summary.append((name, f"ok in {took:.0f} s", line))

    print()
    print(_common.table("Summary", ["benchmark", "status", "headline"], summary))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
